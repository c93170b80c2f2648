// Package execute runs pass graphs through ONNX Runtime and summarises
// every observed value as it comes out (package observe): the execution
// stage of an audit. An Engine holds what the passes of one model share —
// the graph inputs, session options, the model's topological order, the
// values to observe and the memory budget — and Run executes a set of
// passes over the batches, cutting them into segments when the estimated
// memory exceeds the budget.
package execute

import (
	"fp16audit/internal/onnxrt"
)

// Engine runs the passes of one model.
type Engine struct {
	// Inputs are the model's graph inputs, in the order of a batch's
	// tensors.
	Inputs []string
	// Session holds the options every pass's sessions are created with.
	Session onnxrt.SessionOptions
	// Order is the model's topological order; Nodes its number of nodes.
	// Every pass graph keeps the model's nodes at their indices and appends
	// its own after them.
	Order []int
	Nodes int
	// Observe names the values whose statistics each pass returns, and
	// ElemType gives their element types (0 when undeclared).
	Observe  []string
	ElemType func(string) int32
	// MaxMemory bounds the memory the passes plan for, in bytes; 0 plans
	// for DefaultMemoryCap or DefaultMemoryFraction of the available
	// memory, whichever is less.
	MaxMemory int64
	// Progress is told about every finished pass of every batch; nil
	// discards.
	Progress Progress

	notes []string
}

// Notes returns facts about how the passes ran that a report must carry
// (values dropped from observation).
func (e *Engine) Notes() []string { return e.notes }

// BudgetError is an audit refused before it starts because its memory
// estimate exceeds what the machine has: the user must audit less at once
// or pass a budget.
type BudgetError struct {
	Err error
}

func (e *BudgetError) Error() string { return e.Err.Error() }

func (e *BudgetError) Unwrap() error { return e.Err }
