// Command cireport reads the `go test -json` event files that .ci/run's
// phases write through gotestsum (which reruns a failed test once, alone)
// and prints, at the end of CI's log, the tests that passed only on their
// rerun (flaky: each a defect to fix) with their first failure, the tests
// that failed twice, and the line "ci: N passed, N failed, N skipped".
//
//	go run ./cmd/internal/cireport PHASE=FILE [PHASE=FILE ...]
//
// A missing file is a phase that ran no test. It exits 0 once it could
// read its files: the phases' exit codes decide CI.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
)

func main() {
	var phases []phaseFile
	for _, arg := range os.Args[1:] {
		name, file, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "cireport: argument %q is not PHASE=FILE\n", arg)
			os.Exit(2)
		}
		phases = append(phases, phaseFile{name: name, file: file})
	}
	r, err := readPhases(phases)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cireport: %v\n", err)
		os.Exit(1)
	}
	r.print(os.Stdout)
}

type phaseFile struct{ name, file string }

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// testResult is one test's history across the first run and its rerun.
type testResult struct {
	phase, pkg, name string
	outcomes         []string // pass, fail or skip, in the order they came
	firstOutput      []string // what the test printed up to its first outcome
}

// report is what the phases' files say.
type report struct {
	passed, failed, skipped int
	flaky, failedTwice      []*testResult
	// packagesFailed are packages that failed outside any test (a build
	// failure, a panic in TestMain, a test binary that died).
	packagesFailed []string
}

func readPhases(phases []phaseFile) (*report, error) {
	r := &report{}
	for _, p := range phases {
		f, err := os.Open(p.file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		tests, pkgs, err := readEvents(p.name, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.file, err)
		}
		r.add(tests, pkgs)
	}
	return r, nil
}

// readEvents returns each test's history in the order the tests first
// appeared, and each package's last package-level outcome.
func readEvents(phase string, rd io.Reader) ([]*testResult, map[string]string, error) {
	var order []*testResult
	byKey := map[string]*testResult{}
	pkgs := map[string]string{}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue // gotestsum writes only events; be lenient all the same
		}
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, nil, fmt.Errorf("an event that is not JSON: %w", err)
		}
		if e.Test == "" {
			if e.Action == "pass" || e.Action == "fail" || e.Action == "skip" {
				pkgs[e.Package] = e.Action
			}
			continue
		}
		key := e.Package + "\x00" + e.Test
		t := byKey[key]
		if t == nil {
			t = &testResult{phase: phase, pkg: e.Package, name: e.Test}
			byKey[key] = t
			order = append(order, t)
		}
		switch e.Action {
		case "pass", "fail", "skip":
			t.outcomes = append(t.outcomes, e.Action)
		case "output":
			if len(t.outcomes) == 0 {
				t.firstOutput = append(t.firstOutput, e.Output)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	return order, pkgs, nil
}

func (r *report) add(tests []*testResult, pkgs map[string]string) {
	failedIn := map[string]bool{}
	var flaky, twice []*testResult
	for _, t := range tests {
		if len(t.outcomes) == 0 {
			continue // started, never ended: its package's failure says why
		}
		switch t.outcomes[len(t.outcomes)-1] {
		case "pass":
			r.passed++
			if slices.Contains(t.outcomes, "fail") {
				flaky = append(flaky, t)
			}
		case "fail":
			r.failed++
			failedIn[t.pkg] = true
			twice = append(twice, t)
		case "skip":
			r.skipped++
		}
	}
	r.flaky = append(r.flaky, leaves(flaky)...)
	r.failedTwice = append(r.failedTwice, leaves(twice)...)
	var names []string
	for pkg, outcome := range pkgs {
		if outcome == "fail" && !failedIn[pkg] {
			names = append(names, pkg)
		}
	}
	sort.Strings(names)
	r.packagesFailed = append(r.packagesFailed, names...)
	r.failed += len(names)
}

// leaves drops a test whose subtest is in the list too: a parent fails
// with its subtest, and the subtest is the one to name.
func leaves(ts []*testResult) []*testResult {
	var out []*testResult
	for _, t := range ts {
		if !slices.ContainsFunc(ts, func(u *testResult) bool { return u.pkg == t.pkg && strings.HasPrefix(u.name, t.name+"/") }) {
			out = append(out, t)
		}
	}
	return out
}

// logLine matches what t.Error, t.Fatal and t.Log print: "file.go:123: …".
var logLine = regexp.MustCompile(`^\s*[\w./-]+\.go:\d+: `)

// firstFailure is the test's first failure message, on one line, at most
// 300 characters: a panic or a data race; else the first line t.Error or
// t.Fatal printed that reads like a failure ("… want …", "timed out"),
// since t.Log lines look the same in the output; else the first such line.
func (t *testResult) firstFailure() string {
	var first, failure string
	for _, o := range t.firstOutput {
		s := strings.TrimSpace(o)
		if strings.HasPrefix(s, "panic:") || strings.Contains(s, "DATA RACE") {
			failure = s
			break
		}
		if !logLine.MatchString(o) {
			continue
		}
		if first == "" {
			first = s
		}
		if failure == "" && (strings.Contains(s, "want") || strings.Contains(s, "timed out") || strings.Contains(s, "unexpected")) {
			failure = s
		}
	}
	msg := cmp.Or(failure, first, "(no message; see the test's output above)")
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return msg
}

func (r *report) print(w io.Writer) {
	if len(r.flaky) > 0 {
		fmt.Fprintf(w, "ci: %d test(s) failed and passed on their rerun — flaky, each a defect to fix:\n", len(r.flaky))
		for _, t := range r.flaky {
			fmt.Fprintf(w, "  RERUN %s (%s, phase %s): first failure: %s\n", t.name, t.pkg, t.phase, t.firstFailure())
		}
	} else {
		fmt.Fprintln(w, "ci: no test passed only on its rerun")
	}
	if len(r.failedTwice)+len(r.packagesFailed) > 0 {
		fmt.Fprintln(w, "ci: failed (a test here failed on its rerun too, or was not rerun):")
	}
	for _, t := range r.failedTwice {
		fmt.Fprintf(w, "  FAILED %s (%s, phase %s): %s\n", t.name, t.pkg, t.phase, t.firstFailure())
	}
	for _, pkg := range r.packagesFailed {
		fmt.Fprintf(w, "  FAILED package %s outside any test (build failure, TestMain or a test binary that died)\n", pkg)
	}
	fmt.Fprintf(w, "ci: %d passed, %d failed, %d skipped\n", r.passed, r.failed, r.skipped)
}
