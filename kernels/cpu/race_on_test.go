//go:build race

package cpu

// raceOn reports that the tests run under the race detector.
const raceOn = true
