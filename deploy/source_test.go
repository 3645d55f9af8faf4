package deploy

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// mainModule is paydedup's module root, relative to this package.
const mainModule = ".."

// binary holds what the deploy tree must agree with, read from the main
// module's source rather than imported: importing it would tie this module's
// go.mod to every dependency bump over there.
type binary struct {
	// From stream/config.go.
	stream        string // DefaultStream
	durable       string // DefaultDurable
	maxAckPending int    // DefaultMaxAckPending
	// From consumer/config.go.
	drainTimeout time.Duration // DefaultDrainTimeout
	concurrency  int           // DefaultConcurrency
	keyRetention time.Duration // DefaultKeyRetention

	// String literals of every non-test Go file: the environment variables it
	// reads, the HTTP routes it serves, the metric names it registers.
	literals map[string]bool
	// hasVersionVar: package main declares var version, the target of
	// -ldflags "-X main.version=...".
	hasVersionVar bool
	// goVersion is the main module's go directive, e.g. "1.26.0".
	goVersion string
}

var (
	binaryOnce sync.Once
	binaryInfo *binary
	binaryErr  error
)

// readBinary parses the main module's source once per test binary.
func readBinary(t *testing.T) *binary {
	t.Helper()
	binaryOnce.Do(func() { binaryInfo, binaryErr = parseBinary(mainModule) })
	if binaryErr != nil {
		t.Fatalf("read paydedup's source: %v", binaryErr)
	}
	return binaryInfo
}

func parseBinary(root string) (*binary, error) {
	b := &binary{literals: map[string]bool{}}
	for _, f := range []struct {
		file string
		name string
		dst  any
	}{
		{"stream/config.go", "DefaultStream", &b.stream},
		{"stream/config.go", "DefaultDurable", &b.durable},
		{"stream/config.go", "DefaultMaxAckPending", &b.maxAckPending},
		{"consumer/config.go", "DefaultDrainTimeout", &b.drainTimeout},
		{"consumer/config.go", "DefaultConcurrency", &b.concurrency},
		{"consumer/config.go", "DefaultKeyRetention", &b.keyRetention},
	} {
		consts, err := goConsts(filepath.Join(root, filepath.FromSlash(f.file)))
		if err != nil {
			return nil, err
		}
		v, ok := consts[f.name]
		if !ok {
			return nil, fmt.Errorf("%s: constant %s not found (renamed? update deploy/source_test.go)", f.file, f.name)
		}
		switch dst := f.dst.(type) {
		case *string:
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("%s: %s is not a string constant", f.file, f.name)
			}
			*dst = s
		case *int:
			n, ok := v.(int64)
			if !ok {
				return nil, fmt.Errorf("%s: %s is not an integer constant", f.file, f.name)
			}
			*dst = int(n)
		case *time.Duration:
			n, ok := v.(int64)
			if !ok {
				return nil, fmt.Errorf("%s: %s is not a duration constant", f.file, f.name)
			}
			*dst = time.Duration(n)
		}
	}

	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch name := d.Name(); {
			case path == root:
			case name == "deploy" || name == "testdata" || name == "vendor" || strings.HasPrefix(name, "."):
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					b.literals[s] = true
				}
			}
			return true
		})
		if f.Name.Name == "main" && filepath.Dir(path) == filepath.Join(root, "cmd", "paydedup") {
			for _, decl := range f.Decls {
				if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
					for _, spec := range g.Specs {
						for _, name := range spec.(*ast.ValueSpec).Names {
							if name.Name == "version" {
								b.hasVersionVar = true
							}
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+(?:\.\d+)?)\s*$`).FindSubmatch(mod)
	if m == nil {
		return nil, fmt.Errorf("go.mod: no go directive")
	}
	b.goVersion = string(m[1])
	return b, nil
}

// envNamePattern matches the environment variables paydedup reads; the
// binary's source must spell every such name the deploy tree sets.
var envNamePattern = regexp.MustCompile(`^(DATABASE|NATS|PAYDEDUP|STRIPE)_[A-Z0-9_]+$`)

// readsEnv reports whether the binary's source names the variable. Names
// outside paydedup's prefixes (GOMEMLIMIT, TZ) are not its business.
func (b *binary) readsEnv(name string) bool {
	return !envNamePattern.MatchString(name) || b.literals[name]
}

// goConsts returns the constants declared in a Go file whose values are
// string literals or integer expressions such as 20 * time.Second
// (durations come back as nanoseconds).
func goConsts(path string) (map[string]any, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil {
						out[name.Name] = s
					}
					continue
				}
				if n, ok := evalInt(vs.Values[i]); ok {
					out[name.Name] = n
				}
			}
		}
	}
	return out, nil
}

var timeUnits = map[string]int64{
	"Nanosecond": int64(time.Nanosecond), "Microsecond": int64(time.Microsecond),
	"Millisecond": int64(time.Millisecond), "Second": int64(time.Second),
	"Minute": int64(time.Minute), "Hour": int64(time.Hour),
}

// evalInt evaluates integer literals, time units and their products.
func evalInt(e ast.Expr) (int64, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.INT {
			return 0, false
		}
		n, err := strconv.ParseInt(strings.ReplaceAll(e.Value, "_", ""), 0, 64)
		return n, err == nil
	case *ast.ParenExpr:
		return evalInt(e.X)
	case *ast.SelectorExpr:
		if pkg, ok := e.X.(*ast.Ident); ok && pkg.Name == "time" {
			n, ok := timeUnits[e.Sel.Name]
			return n, ok
		}
	case *ast.BinaryExpr:
		x, okx := evalInt(e.X)
		y, oky := evalInt(e.Y)
		if !okx || !oky {
			return 0, false
		}
		switch e.Op {
		case token.MUL:
			return x * y, true
		case token.ADD:
			return x + y, true
		case token.SUB:
			return x - y, true
		}
	}
	return 0, false
}

func TestReadBinary(t *testing.T) {
	b := readBinary(t)
	// The literal scan must see the routes and variables the assertions rely
	// on; if the binary stops spelling them out, these tests must be revisited
	// rather than pass vacuously.
	for _, lit := range []string{"GET /livez", "GET /readyz", "GET /metrics", "PAYDEDUP_ADMIN_ADDR", "PAYDEDUP_DRAIN_TIMEOUT", "DATABASE_URL", "STRIPE_SECRET_KEY"} {
		if !b.literals[lit] {
			t.Errorf("paydedup's source has no string literal %q", lit)
		}
	}
	if b.stream == "" || b.durable == "" || b.drainTimeout <= 0 || b.concurrency <= 0 || b.maxAckPending <= 0 {
		t.Errorf("consumer defaults incomplete: %+v", *b)
	}
	if !b.hasVersionVar {
		t.Error("cmd/paydedup declares no var version: the Dockerfile's -X main.version would set nothing")
	}
}

func TestEvalInt(t *testing.T) {
	tests := []struct {
		expr string
		want int64
		ok   bool
	}{
		{"64", 64, true},
		{"99_999_999", 99999999, true},
		{"20 * time.Second", int64(20 * time.Second), true},
		{"14 * 24 * time.Hour", int64(14 * 24 * time.Hour), true},
		{"(2 * time.Minute)", int64(2 * time.Minute), true},
		{"time.Second", int64(time.Second), true},
		{"64 << 10", 0, false},
		{"DefaultLease", 0, false},
	}
	for _, tt := range tests {
		e, err := parser.ParseExpr(tt.expr)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := evalInt(e)
		if got != tt.want || ok != tt.ok {
			t.Errorf("evalInt(%s) = %d, %v; want %d, %v", tt.expr, got, ok, tt.want, tt.ok)
		}
	}
}
