// Package backward runs generated backward graphs in ONNX Runtime, next to
// the forward passes of package execute: Probe runs a forward model once
// to record what package grad needs to know about a batch (the shape of
// every value and the small integer values shape arithmetic computes), and
// a Session runs a graph grad.Build generated — forward, loss and every
// gradient — at a given loss scale.
package backward
