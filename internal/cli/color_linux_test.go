package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// openPTY opens a pseudo-terminal and returns its two ends: what a command
// writes to tty, master reads.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Fatalf("unlock pty: %v", errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		t.Fatalf("pty number: %v", errno)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close(); tty.Close() })
	return master, tty
}

// onTerminal runs the command line with stdout on a terminal and returns
// what the terminal showed.
func onTerminal(t *testing.T, args ...string) string {
	t.Helper()
	master, tty := openPTY(t)
	got := make(chan []byte)
	go func() {
		// The terminal's buffer is small: read while the command writes.
		var b bytes.Buffer
		io.Copy(&b, master)
		got <- b.Bytes()
	}()
	var stderr bytes.Buffer
	Main(args, tty, &stderr)
	tty.Close()
	return string(<-got)
}

// TestScalesColor: on a terminal, scales colours its text like run, and
// neither --no-color nor a set NO_COLOR does.
func TestScalesColor(t *testing.T) {
	args := []string{"scales", scalesData + "early_nan.json"}
	t.Setenv("NO_COLOR", "")
	if out := onTerminal(t, args...); !strings.Contains(out, "\x1b[") || !strings.Contains(out, "verdict: early-nan") {
		t.Errorf("no colours on a terminal:\n%q", out)
	}
	if out := onTerminal(t, append(args, "--no-color")...); strings.Contains(out, "\x1b[") {
		t.Errorf("colours with --no-color:\n%q", out)
	}
	t.Setenv("NO_COLOR", "1")
	if out := onTerminal(t, args...); strings.Contains(out, "\x1b[") {
		t.Errorf("colours with NO_COLOR set:\n%q", out)
	}
}
