package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// dockerfile is what the end-to-end cluster takes from the repository's
// Dockerfile to build localdir's image offline (driverImage): the build
// stage's go build command, the Debian packages the final stage installs,
// its user, labels and entrypoint. Reading them from the Dockerfile keeps
// the two images in step; TestDockerfile fails when the Dockerfile takes a
// shape this reader does not know.
type dockerfile struct {
	// BuildCmd is the build stage's `RUN CGO_ENABLED=0 go build …` command
	// (continuation lines joined), its output path Output.
	BuildCmd, Output string
	// Base is the final stage's FROM image; Packages what it installs with
	// apt-get install.
	Base     string
	Packages []string
	// User is the final stage's USER, Entrypoint its ENTRYPOINT (exec
	// form), Labels its LABELs.
	User       string
	Entrypoint []string
	Labels     map[string]string
	// Copy is the final stage's `COPY --from=build <Output> <Copy>`
	// destination.
	Copy string
}

// readDockerfile parses the Dockerfile at path.
func readDockerfile(path string) (*dockerfile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	// Instructions: comments dropped, continuation lines joined.
	var instrs []string
	cur := ""
	for _, line := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(line)
		// Comment lines, also inside a continuation, are dropped (as
		// Docker does); so are empty ones.
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		if strings.HasSuffix(t, "\\") {
			cur += strings.TrimSuffix(t, "\\") + " "
			continue
		}
		instrs = append(instrs, strings.Join(strings.Fields(cur+t), " "))
		cur = ""
	}
	d := &dockerfile{Labels: map[string]string{}}
	stages := 0
	// What each stage may hold: anything else is a change driverImage does
	// not make, and an error here.
	allowed := []map[string]bool{
		{"ARG": true, "FROM": true},
		{"WORKDIR": true, "COPY": true, "RUN": true, "ARG": true, "FROM": true},
		{"RUN": true, "ARG": true, "LABEL": true, "COPY": true, "USER": true, "ENTRYPOINT": true},
	}
	runs := 0
	for _, in := range instrs {
		op, arg, _ := strings.Cut(in, " ")
		op = strings.ToUpper(op)
		if stages > 2 || !allowed[stages][op] {
			return nil, fmt.Errorf("%s: %s in stage %d: the end-to-end image builder (tests/e2e/harness) does not know it; teach driverImage", path, op, stages)
		}
		if stages == 2 && op == "RUN" {
			if runs++; runs > 1 {
				return nil, fmt.Errorf("%s: more than one RUN in the final stage: the end-to-end image builder knows one apt-get install", path)
			}
		}
		switch op {
		case "FROM":
			stages++
			d.Base = strings.Fields(arg)[0]
		case "RUN":
			if stages == 1 && strings.Contains(arg, " go build ") {
				d.BuildCmd = arg
				if m := regexp.MustCompile(` -o (\S+) `).FindStringSubmatch(arg); m != nil {
					d.Output = m[1]
				}
			}
			if stages == 2 {
				m := regexp.MustCompile(`apt-get install ((?:-\S+ )*)([^&]+)`).FindAllStringSubmatch(arg, -1)
				if len(m) != 1 {
					return nil, fmt.Errorf("%s: the final stage's RUN must hold one apt-get install, has %d", path, len(m))
				}
				d.Packages = strings.Fields(m[0][2])
			}
		case "USER":
			d.User = arg
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(arg), &d.Entrypoint); err != nil {
				return nil, fmt.Errorf("%s: ENTRYPOINT %s: want the exec form: %w", path, arg, err)
			}
		case "LABEL":
			for _, m := range regexp.MustCompile(`(\S+?)="([^"]*)"`).FindAllStringSubmatch(arg, -1) {
				d.Labels[m[1]] = m[2]
			}
		case "COPY":
			if stages == 2 {
				f := strings.Fields(arg)
				if len(f) != 3 || f[0] != "--from=build" || f[1] != d.Output {
					return nil, fmt.Errorf("%s: final stage COPY %s: the end-to-end image builder knows only the built binary's", path, arg)
				}
				d.Copy = f[2]
			}
		}
	}
	var missing []string
	for what, v := range map[string]string{"the go build RUN of the first stage": d.BuildCmd, "its -o output": d.Output,
		"the COPY --from=build of that output": d.Copy, "USER": d.User} {
		if v == "" {
			missing = append(missing, what)
		}
	}
	if stages != 2 {
		missing = append(missing, "exactly two stages")
	}
	if len(d.Packages) == 0 {
		missing = append(missing, "the final stage's apt-get install")
	}
	if len(d.Entrypoint) == 0 {
		missing = append(missing, "ENTRYPOINT")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s: not found: %s", path, strings.Join(missing, ", "))
	}
	return d, nil
}
