package main

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestArchitectureNamesEveryPackage: ARCHITECTURE.md's map names every Go
// package of the module, so a new package cannot go unlisted. A package is
// named by its path, or, below a folder listed as "folder/*" (the
// architectures under engine/models/*), by its own name.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	doc, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := goPackageDirs(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("found only %d packages: %v", len(pkgs), pkgs)
	}
	for _, p := range pkgs {
		if !named(string(doc), p) {
			t.Errorf("ARCHITECTURE.md does not name package %s", p)
		}
	}
}

// named reports whether doc names package directory p.
func named(doc, p string) bool {
	if strings.Contains(doc, p) {
		return true
	}
	parent, base := path.Split(p)
	return strings.Contains(doc, parent+"*") && regexp.MustCompile(`\b`+regexp.QuoteMeta(base)+`\b`).MatchString(doc)
}

// goPackageDirs lists the directories below root (relative, slash-separated)
// that hold Go files, skipping those the go command ignores (testdata, and
// names starting with "." or "_") and root itself.
func goPackageDirs(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(file string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if file != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(file))
		if dir != "." && (len(dirs) == 0 || dirs[len(dirs)-1] != dir) {
			dirs = append(dirs, dir)
		}
		return nil
	})
	return dirs, err
}
