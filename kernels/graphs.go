package kernels

// StepGraphs counts how a device that records its steps (CUDA graphs)
// launched them: the figures `ferrite bench` and the device tests report.
// A step is launched one way: replayed from a graph (Replays, a step just
// captured included), or eagerly (Eager: a trace seen for the first time
// among the recent ones, or graphs off).
type StepGraphs struct {
	Captures  int   // graphs captured (each also counts as a replay)
	Replays   int   // steps launched as one graph
	Eager     int   // steps launched kernel by kernel
	Evictions int   // graphs destroyed to make room for newer ones
	Cached    int   // graphs held now
	Err       error // why capturing failed and graphs went off; nil while on
}

// StepGrapher is an optional capability of a Device that replays
// repeated steps as graphs: its counts so far.
type StepGrapher interface {
	StepGraphStats() StepGraphs
}

// StepGraphStats returns be's step-graph counts and whether it keeps any
// (a StepGrapher).
func StepGraphStats(be any) (StepGraphs, bool) {
	g, ok := be.(StepGrapher)
	if !ok {
		return StepGraphs{}, false
	}
	return g.StepGraphStats(), true
}

// Sub is s minus an earlier reading of the same counters (Cached and Err
// stay s's).
func (s StepGraphs) Sub(before StepGraphs) StepGraphs {
	s.Captures -= before.Captures
	s.Replays -= before.Replays
	s.Eager -= before.Eager
	s.Evictions -= before.Evictions
	return s
}
