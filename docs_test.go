package outbox_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsLinksResolve: every relative link of README.md, docs/,
// BENCHMARKS.md and CHAOS.md names a file of the repository, and every
// #anchor a heading of its page (GitHub's anchors: lower case, spaces to
// hyphens, punctuation dropped). A guide moved or a heading renamed breaks
// the build, not a reader's click.
func TestDocsLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "README.md", "BENCHMARKS.md", "CHAOS.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	headingsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		b, err := os.ReadFile(page)
		if err != nil {
			return nil
		}
		a := map[string]bool{}
		inCode := false
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "```") {
				inCode = !inCode
			}
			if inCode || !strings.HasPrefix(line, "#") {
				continue
			}
			h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
			h = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`).ReplaceAllString(h, "")
			a[strings.ReplaceAll(h, " ", "-")] = true
		}
		anchors[page] = a
		return a
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			if file == "" {
				file = page
			} else {
				file = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s: link %q: no file %s", page, target, file)
				continue
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !headingsOf(file)[anchor] {
				t.Errorf("%s: link %q: %s has no heading #%s", page, target, file, anchor)
			}
		}
	}
}

// TestDocsGoBlocksParse: every go code block of README.md and docs/ is Go
// a reader can paste: a whole file, declarations, or statements (a "…"
// stands for code the reader writes). It parses them; the README's
// example and the setup snippet are compiled too (examples/readme,
// Example_setup), the guides' fragments are not type-checked.
func TestDocsGoBlocksParse(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "README.md")
	block := regexp.MustCompile("(?s)```go\n(.*?)```")
	isFile := regexp.MustCompile(`(?m)^package `)
	// paste makes a block Go: a "…" in code (not in a comment) becomes an
	// empty statement.
	paste := func(block string) string {
		var out []string
		for line := range strings.Lines(block) {
			code, comment, found := strings.Cut(line, "//")
			code = strings.ReplaceAll(code, "…", ";")
			if found {
				code += "//" + comment
			}
			out = append(out, code)
		}
		return strings.Join(out, "")
	}
	blocks := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllStringSubmatch(string(b), -1) {
			blocks++
			src := paste(m[1])
			fset := token.NewFileSet()
			if isFile.MatchString(src) {
				if _, err := parser.ParseFile(fset, page, src, 0); err != nil {
					t.Errorf("%s: a go block does not parse: %v\n%s", page, err, m[1])
				}
				continue
			}
			_, declErr := parser.ParseFile(fset, page, "package p\n"+src, 0)
			_, stmtErr := parser.ParseFile(fset, page, "package p\nfunc _() {\n"+src+"\n}\n", 0)
			if declErr != nil && stmtErr != nil {
				t.Errorf("%s: a go block parses neither as declarations nor as statements: %v\n%s", page, stmtErr, m[1])
			}
		}
	}
	if blocks < 10 {
		t.Errorf("found %d go blocks; the pattern lost them", blocks)
	}
}
