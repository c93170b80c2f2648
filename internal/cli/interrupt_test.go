package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestOnInterrupt: the first signal ends the context and says so; only
// the second calls for the process to quit.
func TestOnInterrupt(t *testing.T) {
	sig := make(chan os.Signal, 2)
	var msg syncBuffer
	quit := make(chan struct{})
	ctx, cancel := onInterrupt(context.Background(), sig, &msg, func() { close(quit) })
	defer cancel()
	sig <- os.Interrupt
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the first interrupt did not end the context")
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("context error %v, want context.Canceled", ctx.Err())
	}
	select {
	case <-quit:
		t.Fatal("the first interrupt quit")
	case <-time.After(50 * time.Millisecond):
	}
	sig <- os.Interrupt
	select {
	case <-quit:
	case <-time.After(10 * time.Second):
		t.Fatal("the second interrupt did not quit")
	}
	if !strings.Contains(msg.String(), "press Ctrl-C again") {
		t.Errorf("first interrupt said %q", msg.String())
	}
}

// TestOnInterruptReleased: after cancel, a signal is no longer acted on.
func TestOnInterruptReleased(t *testing.T) {
	sig := make(chan os.Signal, 2)
	ctx, cancel := onInterrupt(context.Background(), sig, &syncBuffer{}, func() { t.Error("quit after cancel") })
	cancel()
	sig <- os.Interrupt
	sig <- os.Interrupt
	<-ctx.Done()
	time.Sleep(50 * time.Millisecond)
}

// TestAbandonRemovesPartialReport: a second interrupt while a report is
// being written removes the temporary file and exits with the code of an
// interrupted run.
func TestAbandonRemovesPartialReport(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "report.json")
	writing, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- writeOutput(path, nil, func(w io.Writer) error {
			w.Write([]byte(`{"schema": "half a rep`))
			close(writing)
			<-release
			return nil
		})
	}()
	<-writing
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("while writing, the folder holds %d files, want the temporary one", len(entries))
	}
	code := -1
	exit = func(c int) { code = c }
	defer func() { exit = os.Exit }()
	var msg bytes.Buffer
	abandon(&msg)
	if code != exitModel || !strings.Contains(msg.String(), "no report written") {
		t.Errorf("abandon: exit %d, %q; want exit %d and no report written", code, msg.String(), exitModel)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("after abandon the folder holds %s", entries[0].Name())
	}
	close(release)
	if err := <-done; err == nil {
		t.Error("the write finished after its file was removed")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("report %s exists after abandon: %v", path, err)
	}
}

// TestSecondInterruptQuits runs the command in a child process on a model
// that is a named pipe nobody writes to: reading it cannot be interrupted,
// so the first SIGINT leaves the process waiting and the second ends it,
// with exit 3 and no report.
func TestSecondInterruptQuits(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := syscall.Mkfifo(model, 0o600); err != nil {
		t.Skipf("no named pipes here: %v", err)
	}
	report := filepath.Join(dir, "report.json")
	// A child that ignores both interrupts is killed after two minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "--", "run", model, "--format", "json", "--output", report)
	cmd.Env = append(os.Environ(), "FP16AUDIT_HELPER_PROCESS=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Opening the pipe for writing without blocking succeeds once the
	// child opens it for reading, which it does after its signal handling
	// is in place. The write end stays open and silent, so the child's
	// read waits.
	var fd int
	deadline := time.Now().Add(time.Minute)
	for {
		fd, err = syscall.Open(model, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child never opened the model: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer syscall.Close(fd)
	lines := bufio.NewScanner(stderr)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if !lines.Scan() || !strings.Contains(lines.Text(), "press Ctrl-C again") {
		t.Fatalf("after the first SIGINT the child said %q, want the stopping message", lines.Text())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("the child ended after the first SIGINT, reading a pipe it cannot stop reading: %v", err)
	}
	var rest strings.Builder
	for lines.Scan() {
		rest.WriteString(lines.Text() + "\n")
	}
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitModel || !strings.Contains(rest.String(), "interrupted again") {
		t.Fatalf("exit %d (%v), stderr %q; want exit %d and \"interrupted again\"", code, err, rest.String(), exitModel)
	}
	if _, err := os.Stat(report); !os.IsNotExist(err) {
		t.Errorf("report written: %v", err)
	}
}

// syncBuffer is a bytes.Buffer that a goroutine writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
