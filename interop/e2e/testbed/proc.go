//go:build linux

package testbed

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Logf prints one progress line (testing.T.Logf, log.Printf, ...).
type Logf func(format string, args ...any)

// Proc is one long-running program started by the bed.
type Proc struct {
	Name string // short label used in logs ("relay", "tailscaled-a")
	cmd  *exec.Cmd
	out  *logBuffer
	done chan struct{} // closed when the process has exited
	err  error         // exit status, valid after done

	stopOnce sync.Once
}

// logBuffer collects a process's output (bounded: it keeps the head and the
// most recent part) and lets a caller wait for a line.
type logBuffer struct {
	mu      sync.Mutex
	head    bytes.Buffer
	tail    []byte
	dropped int
	waiters []*lineWaiter
	partial []byte
}

type lineWaiter struct {
	substr string
	ch     chan struct{}
}

const (
	logHeadBytes = 64 << 10
	logTailBytes = 256 << 10
)

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := logHeadBytes - b.head.Len(); room > 0 {
		n := min(room, len(p))
		b.head.Write(p[:n])
		b.tail = append(b.tail, p[n:]...)
	} else {
		b.tail = append(b.tail, p...)
	}
	if over := len(b.tail) - logTailBytes; over > 0 {
		b.dropped += over
		b.tail = append(b.tail[:0], b.tail[over:]...)
	}
	// Match waiters against complete lines only.
	b.partial = append(b.partial, p...)
	for {
		i := bytes.IndexByte(b.partial, '\n')
		if i < 0 {
			break
		}
		line := string(b.partial[:i])
		b.partial = b.partial[i+1:]
		kept := b.waiters[:0]
		for _, w := range b.waiters {
			if strings.Contains(line, w.substr) {
				close(w.ch)
			} else {
				kept = append(kept, w)
			}
		}
		b.waiters = kept
	}
	if len(b.partial) > 64<<10 {
		b.partial = b.partial[:0]
	}
	return len(p), nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.head.String()
	if b.dropped > 0 {
		s += fmt.Sprintf("\n[... %d bytes left out ...]\n", b.dropped)
	}
	return s + string(b.tail)
}

// waitFor returns a channel closed when a line containing substr is written
// from now on.
func (b *logBuffer) waitFor(substr string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := &lineWaiter{substr: substr, ch: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	return w.ch
}

// nsCommand builds a command that runs argv inside network namespace ns
// (the root namespace if ns is empty) with extra environment variables.
// It is its own process group and is killed if the test process dies.
func nsCommand(ctx context.Context, ns string, env []string, argv ...string) *exec.Cmd {
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	var cmd *exec.Cmd
	if ctx != nil {
		cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
		// Kill the whole group, not just ip's exec'd child.
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 2 * time.Second
	} else {
		cmd = exec.Command(argv[0], argv[1:]...)
	}
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// startProc starts a long-running program in namespace ns. Its output goes
// to an in-memory buffer that Logs returns.
func startProc(name, ns string, env []string, argv ...string) (*Proc, error) {
	p := &Proc{Name: name, out: new(logBuffer), done: make(chan struct{})}
	p.cmd = nsCommand(nil, ns, env, argv...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	fmt.Fprintf(p.out, "=== %s: %s\n", name, strings.Join(p.cmd.Args, " "))
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		fmt.Fprintf(p.out, "=== %s exited: %v\n", name, p.err)
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id (the program itself: `ip netns exec` execs it).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Logs returns the program's output so far.
func (p *Proc) Logs() string { return p.out.String() }

// Exited reports whether the process has ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// WaitLine waits until the program prints a line containing substr
// (written after the call), the program exits, or the timeout passes.
func (p *Proc) WaitLine(substr string, timeout time.Duration) error {
	ch := p.out.waitFor(substr)
	select {
	case <-ch:
		return nil
	case <-p.done:
		return fmt.Errorf("%s exited before printing %q: %v", p.Name, substr, p.err)
	case <-time.After(timeout):
		return fmt.Errorf("%s did not print %q within %v", p.Name, substr, timeout)
	}
}

// Stop ends the process group: SIGTERM, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	p.stopOnce.Do(func() {
		pgid := p.cmd.Process.Pid
		syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			syscall.Kill(-pgid, syscall.SIGKILL)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
			}
		}
	})
}

// run runs a short command in namespace ns and returns its combined output.
// It is killed when timeout passes.
func run(ns string, timeout time.Duration, env []string, argv ...string) (string, error) {
	return runInput(ns, timeout, env, nil, argv...)
}

// runInput is run with standard input.
func runInput(ns string, timeout time.Duration, env []string, stdin io.Reader, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := nsCommand(ctx, ns, env, argv...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v", timeout)
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// runSplit is run with separate standard output and error, for commands
// whose standard output is JSON.
func runSplit(ns string, timeout time.Duration, env []string, argv ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := nsCommand(ctx, ns, env, argv...)
	var o, e bytes.Buffer
	cmd.Stdout = &o
	cmd.Stderr = &e
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v", timeout)
	}
	if err != nil {
		err = fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(e.String()))
	}
	return o.String(), e.String(), err
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d earlier lines ...]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
