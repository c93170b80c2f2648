// Package backward runs generated backward graphs in ONNX Runtime, next to
// the forward passes of package execute: Probe runs a forward model once
// to record what package grad needs to know about a batch (the shape of
// every value and the small integer values shape arithmetic computes),
// Known gives the same from the shapes a forward pass already recorded
// when the graph computes no such integers, a Session runs a graph
// grad.Build generated — forward, loss and every gradient — at a given
// loss scale and returns every tensor, and a
// MassSession runs the same graph for the backward audit, returning only
// the parameter gradients and, per gradient held in 16 bits, where its
// mass lies (grad.Mass), with the rounding switched on or off per run.
package backward
