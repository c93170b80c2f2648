package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
)

// The process's interrupt handling belongs to the command line, not to the
// library code below it: the first Ctrl-C cancels the audit's context (its
// ONNX Runtime runs stop at their next node and no report is written); a
// second one ends the process at once, for a stage that cannot be
// interrupted (a model read from a pipe, one long kernel), with whatever
// report file was being written removed.

// exit ends the process; the tests replace it.
var exit = os.Exit

// pending holds the temporary files of reports being written, which a
// second interrupt removes before the process ends.
var pending struct {
	mu    sync.Mutex
	files map[string]bool
}

func addPending(name string) {
	pending.mu.Lock()
	defer pending.mu.Unlock()
	if pending.files == nil {
		pending.files = map[string]bool{}
	}
	pending.files[name] = true
}

func dropPending(name string) {
	pending.mu.Lock()
	defer pending.mu.Unlock()
	delete(pending.files, name)
}

// interruptible returns a context that ends at the first interrupt of the
// process (SIGINT), saying so on stderr; a second interrupt abandons the
// run (see abandon). stop releases the signal handling.
func interruptible(stderr io.Writer) (ctx context.Context, stop func()) {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt)
	ctx, cancel := onInterrupt(context.Background(), sig, stderr, func() { abandon(stderr) })
	return ctx, func() {
		signal.Stop(sig)
		cancel()
	}
}

// onInterrupt returns a context that ends at the first value on sig, and
// calls second at the next one. cancel releases the goroutine waiting on
// sig.
func onInterrupt(parent context.Context, sig <-chan os.Signal, stderr io.Writer, second func()) (ctx context.Context, cancel context.CancelFunc) {
	ctx, cancelCtx := context.WithCancel(parent)
	done := make(chan struct{})
	// released reports whether cancel was called: a signal that arrives
	// with it (select picks at random) is not acted on.
	released := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	go func() {
		select {
		case <-sig:
		case <-done:
			return
		}
		if released() {
			return
		}
		fmt.Fprintln(stderr, "fp16audit: interrupted; stopping (press Ctrl-C again to quit at once)")
		cancelCtx()
		select {
		case <-sig:
			if !released() {
				second()
			}
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() { close(done) })
		cancelCtx()
	}
}

// abandon ends the process after a second interrupt: the reports being
// written are removed, so that nothing half-written is left, and the exit
// code is that of an interrupted run.
func abandon(stderr io.Writer) {
	pending.mu.Lock()
	for name := range pending.files {
		os.Remove(name)
	}
	pending.mu.Unlock()
	fmt.Fprintln(stderr, "fp16audit: interrupted again; quit at once, no report written")
	exit(exitModel)
}
