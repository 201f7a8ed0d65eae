//go:build !race

package runtime_test

const raceOn = false
