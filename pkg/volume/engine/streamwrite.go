package engine

import (
	"sync"

	"golang.org/x/sys/unix"
)

// How a receiver writes file data: on a goroutine of its own, so the stream
// is read while the disk writes, through a few page-aligned buffers; large
// aligned writes go around the page cache (O_DIRECT).

// writeBuffers is how many chunks may be read ahead of the disk.
const writeBuffers = 4

type openFile struct {
	fd   int
	size int64
	r    record
	// direct is a second descriptor of the file opened with O_DIRECT
	// (0: not tried yet, -1: the filesystem cannot), align the offset and
	// length alignment its writes need. Only the writer's goroutine uses
	// them while writes are pending.
	direct, align int
}

// directMin is the smallest write sent around the page cache.
const directMin = 64 << 10

// directPart is how many bytes of a write of n bytes at off go through
// f's O_DIRECT descriptor, opening it on first use. Large data is written
// around the page cache: a transfer does not fill the target's memory with
// a volume no one reads yet (nor pay, on a virtual machine, for memory the
// host must back), and its data is on its way to the disk while the stream
// still runs, so the final sync has little left to do.
func (f *openFile) directPart(off int64, n int) int {
	if n < directMin || f.direct < 0 {
		return 0
	}
	if f.direct == 0 {
		f.direct = -1
		var st unix.Statx_t
		if err := unix.Statx(f.fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st); err != nil || st.Mask&unix.STATX_DIOALIGN == 0 || st.Dio_offset_align == 0 || st.Dio_mem_align > pageSize {
			return 0
		}
		// Reopened through its /proc link: the very file f.fd is (a magic
		// link, which O_NOFOLLOW would refuse).
		fd, err := unix.Open(fdPath(f.fd), unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0
		}
		f.direct, f.align = fd, int(st.Dio_offset_align)
	}
	if off%int64(f.align) != 0 {
		return 0
	}
	return n &^ (f.align - 1)
}

// write writes b at off, its aligned head directly.
func (f *openFile) write(b []byte, off int64) error {
	if n := f.directPart(off, len(b)); n > 0 {
		if err := pwriteAll(f.direct, b[:n], off); err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return pwriteAll(f.fd, b, off)
}

// close closes f's descriptors.
func (f *openFile) close() {
	if f.direct > 0 {
		unix.Close(f.direct)
	}
	unix.Close(f.fd)
}

func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// pageSize aligns the buffers (mmap'd), as O_DIRECT wants its memory.
var pageSize = uint32(unix.Getpagesize())

type writeJob struct {
	f   *openFile
	b   []byte
	off int64
}

// writer is a receiver's write-behind: write queues, drain waits for what
// is queued and says the first error.
type writer struct {
	mem     []byte // writeBuffers chunks, mmap'd on first use
	free    chan []byte
	jobs    chan writeJob
	pending sync.WaitGroup
	done    chan struct{}
	mu      sync.Mutex
	err     error
}

func newWriter() *writer {
	return &writer{free: make(chan []byte, writeBuffers), jobs: make(chan writeJob, writeBuffers)}
}

// buffer is a free chunk-sized buffer, waiting for one when all are queued.
func (w *writer) buffer() ([]byte, error) {
	if w.mem == nil {
		mem, err := unix.Mmap(-1, 0, writeBuffers*chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return nil, err
		}
		w.mem = mem
		for i := 0; i < writeBuffers; i++ {
			w.free <- mem[i*chunk : (i+1)*chunk : (i+1)*chunk]
		}
		w.done = make(chan struct{})
		go w.run()
	}
	return <-w.free, nil
}

// giveBack returns a buffer that was not queued.
func (w *writer) giveBack(b []byte) { w.free <- b[:chunk] }

// write queues b (a buffer from buffer) for f at off; an earlier write's
// error stops it.
func (w *writer) write(f *openFile, b []byte, off int64) error {
	if err := w.failed(); err != nil {
		w.giveBack(b)
		return err
	}
	w.pending.Add(1)
	w.jobs <- writeJob{f, b, off}
	return nil
}

func (w *writer) run() {
	defer close(w.done)
	for j := range w.jobs {
		if w.failed() == nil {
			if err := j.f.write(j.b, j.off); err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
			}
		}
		w.free <- j.b[:chunk]
		w.pending.Done()
	}
}

func (w *writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// drain waits until every queued write is done.
func (w *writer) drain() error {
	w.pending.Wait()
	return w.failed()
}

// stop drains w and frees its buffers.
func (w *writer) stop() {
	w.pending.Wait()
	if w.mem == nil {
		return
	}
	close(w.jobs)
	<-w.done
	_ = unix.Munmap(w.mem)
	w.mem = nil
}
