package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// TestServicesScriptFoundFromANestedModule: the cluster tests run in
// cmd/internal/chaos, inside the nested cmd module (its own go.mod); the
// script is found at the repository root all the same.
func TestServicesScriptFoundFromANestedModule(t *testing.T) {
	want, err := filepath.Abs(filepath.Join("..", "..", "scripts", "services.sh"))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join("..", "..", "cmd", "internal", "chaos"))
	if _, err := os.Stat("../../go.mod"); err != nil {
		t.Fatalf("the test no longer starts in the nested cmd module: %v", err)
	}
	got, err := servicesScript()
	if err != nil || got != want {
		t.Fatalf("servicesScript() = %q, %v; want %q", got, err, want)
	}
}
