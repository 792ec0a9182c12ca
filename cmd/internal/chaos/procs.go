package chaos

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Relays starts and signals relay child processes.
type Relays struct {
	// Bin is the outbox-chaos binary (built with -tags outbox_failpoints
	// for failpoints to work).
	Bin string
	// Base is the configuration of every child; RelayID is set per child.
	Base RelayConfig
	// LogDir receives one stderr log per child.
	LogDir string

	mu    sync.Mutex
	procs []*Proc
}

// Proc is one relay child process.
type Proc struct {
	// ID is the relay (or consumer) id.
	ID string
	// Log is the file that receives its stdout and stderr.
	Log string
	// StartedAt is when it started.
	StartedAt time.Time
	cmd       *exec.Cmd
	done      chan struct{}
	// ExitedAt is when Wait returned; valid after Done is closed.
	ExitedAt time.Time
	// Err is the result of Wait; valid after Done is closed.
	Err error
}

// Done is closed when the process exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process (ignored after exit).
func (p *Proc) Signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// Start starts a relay child with id and extra environment (for example
// "OUTBOX_FAILPOINTS=relay/after-fetch=kill@3").
func (r *Relays) Start(id string, env ...string) (*Proc, error) {
	c := r.Base
	c.RelayID = id
	p, err := startProcess(r.Bin, c.Args(), env, filepath.Join(r.LogDir, "relay-"+id+".log"))
	if err != nil {
		return nil, fmt.Errorf("chaos: start relay %s: %w", id, err)
	}
	p.ID = id
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	return p, nil
}

// startProcess starts bin with args and extra environment, its stdout and
// stderr appended to logPath.
func startProcess(bin string, args, env []string, logPath string) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	// Its own process group, so that a signal to the harness's group (a
	// SIGHUP, a terminal's SIGCONT) never resumes a child a fault paused;
	// it dies with the harness.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &Proc{cmd: cmd, done: make(chan struct{}), Log: logPath, StartedAt: time.Now()}
	go func() {
		p.Err = cmd.Wait()
		p.ExitedAt = time.Now()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Stop stops p gracefully (SIGCONT, SIGTERM), SIGKILLs it after timeout,
// and waits for it.
func (p *Proc) Stop(timeout time.Duration) {
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Signal(syscall.SIGKILL)
		<-p.done
	}
}

// StopAll stops every child still running.
func (r *Relays) StopAll(timeout time.Duration) {
	r.mu.Lock()
	ps := append([]*Proc(nil), r.procs...)
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop(timeout)
		}()
	}
	wg.Wait()
}

// ExitSignal returns the signal that ended the process (0 when it exited on
// its own); valid after Done is closed.
func (p *Proc) ExitSignal() syscall.Signal {
	var ee *exec.ExitError
	if !errors.As(p.Err, &ee) {
		return 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}
