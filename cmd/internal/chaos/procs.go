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

// Proc is one child process: a relay or a consumer.
type Proc struct {
	ID        string // the relay (consumer) id
	Log       string // the file of its stdout and stderr
	StartedAt time.Time
	// ExitedAt and Err (Wait's) are valid once Done is closed.
	ExitedAt time.Time
	Err      error
	cmd      *exec.Cmd
	done     chan struct{}
}

// startProcess starts bin as child id, its output appended to logPath.
func startProcess(id, bin string, args, env []string, logPath string) (*Proc, error) {
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
	p := &Proc{ID: id, cmd: cmd, done: make(chan struct{}), Log: logPath, StartedAt: time.Now()}
	go func() {
		p.Err = cmd.Wait()
		p.ExitedAt = time.Now()
		f.Close()
		close(p.done)
	}()
	return p, nil
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

// Kill SIGKILLs p and waits for it.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop stops p gracefully (SIGCONT, SIGTERM), SIGKILLs it after timeout,
// and waits for it.
func (p *Proc) Stop(timeout time.Duration) {
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Kill()
	}
}

// ExitSignal returns the signal that ended the process (0 when it exited on
// its own); valid once Done is closed.
func (p *Proc) ExitSignal() syscall.Signal {
	var ee *exec.ExitError
	if errors.As(p.Err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal()
		}
	}
	return 0
}

// procSet keeps the children of one kind: every one started (stopped at
// the end) and the live ones a fault may take.
type procSet struct {
	mu   sync.Mutex
	all  []*Proc
	live []*Proc // not paused, not stopping
	next int
}

// nextID returns prefix-N, N counting the set's ids.
func (s *procSet) nextID(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	return fmt.Sprintf("%s-%d", prefix, s.next)
}

// start starts child id of kind (relay, consumer), its log dir/kind-id.log
// (live: one a fault may take).
func (s *procSet) start(kind, id, bin, dir string, args, env []string, live bool) (*Proc, error) {
	p, err := startProcess(id, bin, args, env, filepath.Join(dir, kind+"-"+id+".log"))
	if err != nil {
		return nil, fmt.Errorf("chaos: start %s %s: %w", kind, id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, p)
	if live {
		s.live = append(s.live, p)
	}
	return p, nil
}

// take removes a live process (the intn-th) from the set, or returns nil.
func (s *procSet) take(intn func(int) int) *Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.live) == 0 {
		return nil
	}
	i := intn(len(s.live))
	p := s.live[i]
	s.live = append(s.live[:i], s.live[i+1:]...)
	return p
}

func (s *procSet) give(p *Proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live = append(s.live, p)
}

// procs returns every process the set started.
func (s *procSet) procs() []*Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Proc(nil), s.all...)
}

func (s *procSet) stopAll(timeout time.Duration) {
	var wg sync.WaitGroup
	for _, p := range s.procs() {
		wg.Go(func() { p.Stop(timeout) })
	}
	wg.Wait()
}

// Relays starts and signals relay child processes.
type Relays struct {
	// Bin is the outbox-chaos binary (built with -tags outbox_failpoints
	// for failpoints to work).
	Bin string
	// Base is the configuration of every child; RelayID is set per child.
	Base RelayConfig
	// LogDir receives one log per child.
	LogDir string

	set procSet
}

// Start starts a relay child with id and extra environment (for example
// "OUTBOX_FAILPOINTS=relay/after-fetch=kill@3").
func (r *Relays) Start(id string, env ...string) (*Proc, error) { return r.start(id, false, env...) }

// start starts a relay (live: one a fault may take).
func (r *Relays) start(id string, live bool, env ...string) (*Proc, error) {
	c := r.Base
	c.RelayID = id
	return r.set.start("relay", id, r.Bin, r.LogDir, c.Args(), env, live)
}

// add starts n relays named relay-N that faults may take.
func (r *Relays) add(n int) error {
	for range n {
		if _, err := r.start(r.set.nextID("relay"), true); err != nil {
			return err
		}
	}
	return nil
}

// relays returns a pool of relay children of e with the harness's timing
// where base leaves it zero.
func (e Env) relays(base RelayConfig) *Relays {
	base.Dialect, base.Brokers = e.Dialect, e.Brokers
	orDefault(&base.LeaseDuration, leaseDuration)
	orDefault(&base.RenewInterval, renewInterval)
	orDefault(&base.PollInterval, pollInterval)
	orDefault(&base.BatchSize, batchSize)
	return &Relays{Bin: e.Bin, LogDir: e.Dir, Base: base}
}

// StopAll stops every child still running.
func (r *Relays) StopAll(timeout time.Duration) { r.set.stopAll(timeout) }
