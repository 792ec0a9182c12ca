package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// events is a gotestsum event file: a first run in which TestFlaky/sub
// and TestBroken fail, then the rerun of each, alone.
const events = `{"Action":"run","Package":"example.com/p","Test":"TestOK"}
{"Action":"pass","Package":"example.com/p","Test":"TestOK"}
{"Action":"run","Package":"example.com/p","Test":"TestSkipped"}
{"Action":"skip","Package":"example.com/p","Test":"TestSkipped"}
{"Action":"run","Package":"example.com/p","Test":"TestFlaky"}
{"Action":"run","Package":"example.com/p","Test":"TestFlaky/sub"}
{"Action":"output","Package":"example.com/p","Test":"TestFlaky/sub","Output":"=== RUN   TestFlaky/sub\n"}
{"Action":"output","Package":"example.com/p","Test":"TestFlaky/sub","Output":"    flaky_test.go:10: seed 42 (a t.Log line)\n"}
{"Action":"output","Package":"example.com/p","Test":"TestFlaky/sub","Output":"    flaky_test.go:12: lease still held after 3s; want it expired\n"}
{"Action":"output","Package":"example.com/p","Test":"TestFlaky/sub","Output":"    flaky_test.go:13: second message\n"}
{"Action":"fail","Package":"example.com/p","Test":"TestFlaky/sub"}
{"Action":"fail","Package":"example.com/p","Test":"TestFlaky"}
{"Action":"run","Package":"example.com/p","Test":"TestBroken"}
{"Action":"output","Package":"example.com/p","Test":"TestBroken","Output":"    broken_test.go:7: got 3; want 4\n"}
{"Action":"fail","Package":"example.com/p","Test":"TestBroken"}
{"Action":"fail","Package":"example.com/p"}
{"Action":"fail","Package":"example.com/q"}
{"Action":"run","Package":"example.com/p","Test":"TestFlaky"}
{"Action":"run","Package":"example.com/p","Test":"TestFlaky/sub"}
{"Action":"pass","Package":"example.com/p","Test":"TestFlaky/sub"}
{"Action":"pass","Package":"example.com/p","Test":"TestFlaky"}
{"Action":"pass","Package":"example.com/p"}
{"Action":"run","Package":"example.com/p","Test":"TestBroken"}
{"Action":"output","Package":"example.com/p","Test":"TestBroken","Output":"    broken_test.go:7: got 5; want 4\n"}
{"Action":"fail","Package":"example.com/p","Test":"TestBroken"}
{"Action":"fail","Package":"example.com/p"}
`

func reportOf(t *testing.T) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tests.json")
	if err := os.WriteFile(file, []byte(events), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := readPhases([]phaseFile{{"tests", file}, {"chaos", filepath.Join(t.TempDir(), "absent.json")}})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.print(&b)
	return b.String()
}

func TestATestThatPassesOnItsRerunIsListedWithItsFirstFailure(t *testing.T) {
	out := reportOf(t)
	want := "  RERUN TestFlaky/sub (example.com/p, phase tests): first failure: flaky_test.go:12: lease still held after 3s; want it expired\n"
	if !strings.Contains(out, want) {
		t.Errorf("report lacks %q:\n%s", want, out)
	}
	if strings.Contains(out, "RERUN TestFlaky ") {
		t.Errorf("report names the parent of a listed subtest:\n%s", out)
	}
}

func TestATestThatFailsTwiceAndAPackageThatFailsOutsideItsTestsCountAsFailed(t *testing.T) {
	out := reportOf(t)
	for _, want := range []string{
		"  FAILED TestBroken (example.com/p, phase tests): broken_test.go:7: got 3; want 4\n",
		"  FAILED package example.com/q outside any test",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "package example.com/p outside") {
		t.Errorf("a package whose test failed is counted again:\n%s", out)
	}
	// TestOK, TestFlaky and TestFlaky/sub passed; TestBroken and
	// example.com/q failed; the absent file ran no test.
	if !strings.HasSuffix(out, "ci: 3 passed, 2 failed, 1 skipped\n") {
		t.Errorf("closing line wrong:\n%s", out)
	}
}

func TestNoRerunSaysSo(t *testing.T) {
	r, err := readPhases(nil)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.print(&b)
	if want := "ci: no test passed only on its rerun\nci: 0 passed, 0 failed, 0 skipped\n"; b.String() != want {
		t.Errorf("got %q; want %q", b.String(), want)
	}
}
