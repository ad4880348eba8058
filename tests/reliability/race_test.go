//go:build race

package reliability

// raceEnabled: the test binary runs under the race detector, and the driver
// binary the crash storm starts is built with -race too.
const raceEnabled = true
