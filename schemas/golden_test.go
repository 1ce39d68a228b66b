package schemas

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// -update rewrites the .want files of testdata/events from what ParseEvent
// returns now; review the diff before committing it.
var update = flag.Bool("update", false, "rewrite the golden .want files of testdata/events")

// goldenCase is one example event of testdata/events/{valid,invalid}.
type goldenCase struct {
	name  string // file name without extension
	path  string
	raw   []byte
	valid bool
}

func goldenCases(t testing.TB) []goldenCase {
	t.Helper()
	var out []goldenCase
	for _, dir := range []string{"valid", "invalid"} {
		files, err := filepath.Glob(filepath.Join("testdata", "events", dir, "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no golden files in testdata/events/%s", dir)
		}
		sort.Strings(files)
		for _, f := range files {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, goldenCase{name: dir + "/" + strings.TrimSuffix(filepath.Base(f), ".json"), path: f, raw: raw, valid: dir == "valid"})
		}
	}
	return out
}

// wantText is the golden form of a ParseEvent result: the event as indented
// JSON for a valid event, one "reason field" line per violation otherwise.
func wantText(t testing.TB, ev PlayerEvent, vs []Violation) []byte {
	t.Helper()
	if vs == nil {
		b, err := json.MarshalIndent(ev, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		return append(b, '\n')
	}
	var b bytes.Buffer
	for _, v := range vs {
		b.WriteString(v.Reason)
		if v.Field != "" {
			b.WriteString(" " + v.Field)
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// TestGoldenEvents drives ParseEvent with every example file: valid ones must
// parse to the event in their .want file, invalid ones must report exactly the
// reasons (and fields) listed in theirs, in order.
func TestGoldenEvents(t *testing.T) {
	for _, c := range goldenCases(t) {
		t.Run(c.name, func(t *testing.T) {
			ev, vs := ParseEvent(c.raw, ValidateOptions{})
			if c.valid && vs != nil {
				t.Fatalf("valid example refused: %v", vs)
			}
			if !c.valid && vs == nil {
				t.Fatalf("invalid example accepted: %+v", ev)
			}
			got := wantText(t, ev, vs)
			wantPath := strings.TrimSuffix(c.path, ".json") + ".want"
			if *update {
				if err := os.WriteFile(wantPath, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(wantPath)
			if err != nil {
				t.Fatalf("%v (run go test ./schemas -run TestGoldenEvents -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("ParseEvent(%s):\n got:\n%s\nwant:\n%s", c.path, got, want)
			}
			for _, v := range vs {
				if v.Detail == "" {
					t.Errorf("violation %s of %s has no detail", v.Reason, v.Field)
				}
			}
		})
	}
}
