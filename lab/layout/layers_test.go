package layout

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// A use is one name a file of a package takes from another file of the
// same package: From uses Name, which To declares. Name is the package-level
// declaration the used object belongs to: a function, type, variable or
// constant, "Type.method" for a method, "Type.field" for a field.
type use struct {
	From, Name, To string
}

func (u use) String() string { return u.From + " uses " + u.Name + " from " + u.To }

// fileUses type-checks the package's non-test files (the build's GoFiles,
// as `go list` sees them) against its dependencies' export data and returns
// its files and every distinct cross-file use among them, sorted.
func fileUses(t *testing.T, rel string) (files []string, uses []use) {
	t.Helper()
	cmd := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Dir,GoFiles,Export", module+"/"+rel)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -export %s: %v\n%s", rel, err, ee.Stderr)
		}
		t.Fatalf("go list -export %s: %v", rel, err)
	}
	type listed struct {
		ImportPath, Dir, Export string
		GoFiles                 []string
	}
	export := map[string]string{}
	var self listed
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		export[p.ImportPath] = p.Export
		if p.ImportPath == module+"/"+rel {
			self = p
		}
	}
	if len(self.GoFiles) == 0 {
		t.Fatalf("go list found no files in %s", rel)
	}

	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, name := range self.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(self.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if export[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(export[path])
	})}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	pkg, err := conf.Check(self.ImportPath, fset, parsed, info)
	if err != nil {
		t.Fatalf("type-check %s: %v", rel, err)
	}

	// declName names the top-level declaration of file f that encloses pos.
	declName := func(f *ast.File, pos token.Pos) string {
		for _, d := range f.Decls {
			if pos < d.Pos() || pos >= d.End() {
				continue
			}
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					return d.Name.Name
				}
				return recvName(d.Recv.List[0].Type) + "." + d.Name.Name
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if pos < s.Pos() || pos >= s.End() {
						continue
					}
					switch s := s.(type) {
					case *ast.TypeSpec:
						return s.Name.Name
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.Pos() == pos {
								return n.Name
							}
						}
						return s.Names[0].Name
					}
				}
			}
		}
		return ""
	}
	fileOf := map[string]*ast.File{}
	for _, f := range parsed {
		fileOf[filepath.Base(fset.File(f.Pos()).Name())] = f
	}
	seen := map[use]bool{}
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		from := filepath.Base(fset.File(id.Pos()).Name())
		to := filepath.Base(fset.File(obj.Pos()).Name())
		if from == to {
			continue
		}
		name := declName(fileOf[to], obj.Pos())
		if v, ok := obj.(*types.Var); ok && v.IsField() || name != obj.Name() && !strings.Contains(name, ".") {
			name += "." + obj.Name() // a field of the type name declares
		}
		seen[use{from, name, to}] = true
	}
	for u := range seen {
		uses = append(uses, u)
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].String() < uses[j].String() })
	for name := range fileOf {
		files = append(files, name)
	}
	sort.Strings(files)
	return files, uses
}

// recvName is the type name of a method's receiver: T in (t *T) or (t T[P]).
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return "?"
		}
	}
}

// backUses checks the package's files against order (lowest first) and
// returns the uses that run back up: a file using a name declared in a
// file above it. A file missing from order, or listed but gone, fails the
// test: a new file takes its place in the order when it is added.
func backUses(t *testing.T, rel string, order []string) []use {
	t.Helper()
	files, uses := fileUses(t, rel)
	floor := map[string]int{}
	for i, f := range order {
		floor[f] = i
	}
	for _, f := range files {
		if _, ok := floor[f]; !ok {
			t.Errorf("%s/%s is not in the test's order of %s's files: put it where what it uses is below it", rel, f, rel)
		}
	}
	for _, f := range order {
		if !slices.Contains(files, f) {
			t.Errorf("%s/%s is in the test's order but not in the package: remove it", rel, f)
		}
	}
	var back []use
	for _, u := range uses {
		if floor[u.From] < floor[u.To] {
			back = append(back, u)
		}
	}
	if len(uses) < len(files)-1 {
		t.Fatalf("%s: found %d uses between %d files; the check would prove nothing", rel, len(uses), len(files))
	}
	return back
}

// gatewayLayers are gateway's files, lowest first: each uses names only
// from the files before it. The HTTP vocabulary and the door's limits, then
// the payment as a client sees it, the interfaces and the configuration
// the gateway is built on, the rules that decide a POST, the batched
// intake, the Gateway type, its handlers, and at the top New, the routes
// and Serve, which assemble them.
var gatewayLayers = []string{
	"metrics.go",        // the Prometheus metrics
	"http.go",           // headers, problem types, writers, parsers
	"door.go",           // the failed-authentication throttle, the connection cap
	"representation.go", // the payment a client is shown
	"store.go",          // the stores and the publisher the gateway uses
	"pauses.go",         // the cached read of the workers' pauses
	"config.go",         // Config and its defaults
	"base.go",           // what the batched intake and the handlers share
	"answer.go",         // how a POST is decided and answered
	"batch.go",          // the batched intake
	"gateway.go",        // the Gateway type
	"payments.go",       // POST and GET /v1/payments
	"operations.go",     // a payment's refunds, capture and cancel, and their GETs
	"auth.go",           // API key authentication
	"webhookrefund.go",  // a refund event's settle
	"webhook.go",        // POST /v1/stripe/webhooks
	"limits.go",         // the body limits
	"serve.go",          // New, the routes, Serve
}

// TestGatewayFilesFormLayers: no file of gateway uses a name declared in
// a file above it in gatewayLayers, so the package reads bottom up, and a
// file can be understood from the ones below it.
func TestGatewayFilesFormLayers(t *testing.T) {
	for _, u := range backUses(t, "gateway", gatewayLayers) {
		t.Errorf("%s (above it)", u)
	}
}

// consumerLayers are consumer's files, lowest first: of the orders a local
// search tried, the one with the fewest uses running back up.
// consumerBackUses lists those uses, until declarations move and the list
// is empty. It may only shrink: a new use back up fails, and so does an
// entry that no longer occurs (delete its line). A file added or renamed
// takes its place in the order.
var consumerLayers = []string{
	"decision.go",
	"msglog.go",
	"trace.go",
	"pause.go",
	"config.go",
	"limit.go",
	"commit.go",
	"processor.go",
	"refund.go",
	"paymentop.go",
	"ratelimit.go",
	"runner.go",
	"refusalevent.go",
	"net.go",
	"trim.go",
	"worker.go",
	"lane.go",
	"hold.go",
	"intake.go",
	"carddata.go",
	"refusal.go",
}

var consumerBackUses = []string{
	// The lanes' hooks in the fetch loop and settle, and lane.go's use
	// of the Worker: worker.go and lane.go use each other until the fetch
	// loop's stages move out of worker.go.
	"worker.go uses Worker.runLanes from lane.go",
	"worker.go uses Worker.settleLane from lane.go",
	"worker.go uses laneManager from lane.go",
	"worker.go uses newLaneManager from lane.go",
	"commit.go uses NopObserver from worker.go",
	"commit.go uses Observer from worker.go",
	"commit.go uses Observer.Committed from worker.go",
	"commit.go uses Store from processor.go",
	"commit.go uses Store.Complete from processor.go",
	"commit.go uses Store.CompleteBatch from processor.go",
	"config.go uses DefaultTrimInterval from trim.go",
	"config.go uses fetchWait from worker.go",
	"config.go uses maxDeliverRetry from net.go",
	"limit.go uses Processor from processor.go",
	"limit.go uses Processor.calls from processor.go",
	"net.go uses OperatorMarker from intake.go",
	"net.go uses OperatorMarker.MarkIntakeForOperator from intake.go",
	"net.go uses errString from worker.go",
	"net.go uses fetchRetryBase from worker.go",
	"net.go uses fetchRetryMax from worker.go",
	"net.go uses fetchWait from worker.go",
	"net.go uses letterKey from intake.go",
	"pause.go uses Processor from processor.go",
	"pause.go uses Processor.gate from processor.go",
	"processor.go uses NopObserver from worker.go",
	"processor.go uses Observer from worker.go",
	"processor.go uses Observer.Claimed from worker.go",
	"processor.go uses Observer.ProviderCalled from worker.go",
	"processor.go uses Processor.detach from ratelimit.go",
	"processor.go uses Processor.rateLimited from ratelimit.go",
	"processor.go uses Processor.slotUnderLease from ratelimit.go",
	"processor.go uses Processor.stopping from ratelimit.go",
	"processor.go uses errLeaseLost from ratelimit.go",
	"processor.go uses errStopping from ratelimit.go",
	"processor.go uses rateWaits from ratelimit.go",
	"worker.go uses IntakeMarker from intake.go",
	"worker.go uses OperatorMarker from intake.go",
	"worker.go uses Worker.deadLetteredIntake from intake.go",
	"worker.go uses Worker.eraseCardData from carddata.go",
	"worker.go uses Worker.hold from hold.go",
	"worker.go uses Worker.lastDelivery from hold.go",
	"worker.go uses Worker.notePauses from intake.go",
	"worker.go uses Worker.recordRefusal from refusal.go",
}

// TestConsumerFilesFormLayers checks consumer's files against
// consumerLayers: a use back up that consumerBackUses does not list fails,
// and so does a listed one that is gone, so the count only goes down.
func TestConsumerFilesFormLayers(t *testing.T) {
	allowed := map[string]bool{}
	for _, u := range consumerBackUses {
		allowed[u] = true
	}
	back := backUses(t, "consumer", consumerLayers)
	t.Logf("consumer: %d uses run back up between its files (%d listed in consumerBackUses)", len(back), len(consumerBackUses))
	for _, u := range back {
		if !allowed[u.String()] {
			t.Errorf("%s (above it): move the declaration below its user, or the user above it", u)
		}
		delete(allowed, u.String())
	}
	for _, u := range consumerBackUses {
		if allowed[u] {
			t.Errorf("%q no longer runs back up: delete it from consumerBackUses", u)
		}
	}
}
