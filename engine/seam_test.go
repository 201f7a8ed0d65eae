package engine

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// hostParamsAllowed are the functions of the model packages that may take
// float32 slices: MTP hidden rows handed over at a step boundary, and a
// bias selected at load time.
var hostParamsAllowed = map[string]bool{
	"ForwardMTP": true, // hidden rows from the previous step, uploaded with the step's inputs
	"pick":       true, // qwen3next: the query half of a bias, at load
}

// TestSeam checks what issue 12 asks of the model code (non-test files of
// engine/nn, engine/linattn and engine/models): no import of kernels/cpu
// (models run on whatever backend they are given) and no float32-slice
// parameter (activations are backend tensors) but the allowed ones.
func TestSeam(t *testing.T) {
	fset := token.NewFileSet()
	files := 0
	for _, root := range []string{"nn", "linattn", "models"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			if strings.Contains(path, "mlatest") { // a test helper package, imported by tests only
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			files++
			for _, imp := range f.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); p == "github.com/ferrite-llm/ferrite/kernels/cpu" {
					t.Errorf("%s imports kernels/cpu", path)
				}
			}
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || hostParamsAllowed[fn.Name.Name] {
					continue
				}
				for _, p := range fn.Type.Params.List {
					if typ := types(p.Type); strings.Contains(typ, "[]float32") {
						t.Errorf("%s: %s takes a %s parameter", fset.Position(fn.Pos()), fn.Name.Name, typ)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < 20 {
		t.Fatalf("read only %d files", files)
	}
}

// types spells a parameter type's slice structure ("[][]float32").
func types(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.ArrayType:
		if e.Len == nil {
			return "[]" + types(e.Elt)
		}
	case *ast.Ident:
		return e.Name
	case *ast.Ellipsis:
		return "[]" + types(e.Elt)
	}
	return ""
}
