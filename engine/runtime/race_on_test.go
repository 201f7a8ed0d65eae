//go:build race

package runtime_test

// raceOn: the race detector slows the models' arithmetic some tenfold, so
// the tests on fixture checkpoints run smaller workloads.
const raceOn = true
