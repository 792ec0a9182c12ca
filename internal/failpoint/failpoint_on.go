//go:build outbox_failpoints

package failpoint

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// envFailpoints names the environment variable that arms failpoints in a
// binary built with -tags outbox_failpoints. Its value is a list of
// name=action[@hit] separated by semicolons:
//
//	relay/after-fetch=kill@3                 SIGKILL the process at the third hit
//	relay/during-delete=killafter(1ms)@2     SIGKILL 1ms after the second hit, while the step runs
//	relay/during-publish=sleep(2500ms)       sleep at every hit (a slow broker)
//	kafkapub/before-commit=stop@2            SIGSTOP the process at the second hit
//
// Without @hit, kill, killafter and stop fire at the first hit and sleep at
// every hit. A fired kill prints "failpoint NAME: SIGKILL" on stderr first, a
// fired stop "failpoint NAME: SIGSTOP": the process stays stopped, every
// goroutine with it (lease renewals included), until whoever watches its
// stderr sends SIGCONT, and the goroutine at the failpoint goes on only
// once it received that SIGCONT. CHAOS.md lists the failpoints.
const envFailpoints = "OUTBOX_FAILPOINTS"

type failpointRule struct {
	action string // kill, killafter, sleep, stop
	d      time.Duration
	hit    int64 // 0: every hit (sleep) or the first (kill)
	hits   atomic.Int64
}

// failpointRules is parsed once from the environment of a failpoint build.
// It is immutable after parsing (the hit counters are atomic).
var failpointRules = sync.OnceValue(func() map[string]*failpointRule {
	rules := map[string]*failpointRule{}
	for _, spec := range strings.Split(os.Getenv(envFailpoints), ";") {
		spec = strings.TrimSpace(spec)
		if spec == "" {
			continue
		}
		name, act, ok := strings.Cut(spec, "=")
		if !ok {
			panic(fmt.Sprintf("failpoint: %s: %q: want name=action[@hit]", envFailpoints, spec))
		}
		r := &failpointRule{}
		if a, h, ok := strings.Cut(act, "@"); ok {
			n, err := strconv.ParseInt(h, 10, 64)
			if err != nil || n < 1 {
				panic(fmt.Sprintf("failpoint: %s: %q: bad hit %q", envFailpoints, spec, h))
			}
			act, r.hit = a, n
		}
		if a, arg, ok := strings.Cut(act, "("); ok {
			d, err := time.ParseDuration(strings.TrimSuffix(arg, ")"))
			if err != nil {
				panic(fmt.Sprintf("failpoint: %s: %q: %v", envFailpoints, spec, err))
			}
			act, r.d = a, d
		}
		switch act {
		case "kill", "killafter", "sleep", "stop":
		default:
			panic(fmt.Sprintf("failpoint: %s: %q: unknown action %q", envFailpoints, spec, act))
		}
		if r.hit == 0 && act != "sleep" {
			r.hit = 1
		}
		r.action = act
		rules[name] = r
	}
	return rules
})

// Inject runs the action armed for name, if any.
func Inject(name string) {
	r := failpointRules()[name]
	if r == nil {
		return
	}
	n := r.hits.Add(1)
	if r.hit != 0 && n != r.hit {
		return
	}
	switch r.action {
	case "sleep":
		time.Sleep(r.d)
	case "kill":
		killSelf(name)
	case "killafter":
		go func() {
			time.Sleep(r.d)
			killSelf(name)
		}()
	case "stop":
		stopSelf(name)
	}
}

// stopSelf SIGSTOPs the process and returns once it got SIGCONT. A stop
// spreads to a process's threads when each next enters the kernel, so the
// calling thread could run on after kill(2) returned, up to its next system
// call (the very request the stop is meant to hold back, say); so the
// caller waits for the SIGCONT itself.
func stopSelf(name string) {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	fmt.Fprintf(os.Stderr, "failpoint %s: SIGSTOP\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	<-cont
}

func killSelf(name string) {
	fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
