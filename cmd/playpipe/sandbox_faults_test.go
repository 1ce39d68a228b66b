package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSandboxFaultsFlag: --faults (inline or @FILE) sets the starting
// faults, in lean mode too, as GET /admin/faults shows; an invalid value is
// a usage error naming the field.
func TestSandboxFaultsFlag(t *testing.T) {
	for _, bad := range []string{`{"report":{"rate_500":2}}`, `{"mix":{"track_ids":[1]}}`, `{"report":{"nope":1}}`, `@/nonexistent/faults.json`} {
		var out syncBuffer
		// Cancelled and on free ports: a value wrongly accepted ends the run at once.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := runSandbox(ctx, []string{"--addr", "127.0.0.1:0", "--admin-addr", "off", "--faults", bad}, &out, &out); !errors.Is(err, errUsage) {
			t.Errorf("--faults %s: err %v, output %s", bad, err, out.String())
		}
	}
	file := filepath.Join(t.TempDir(), "faults.json")
	body := `{"seed":7,"report":{"rate_500":0.01,"latency":"50ms","track_ids":[400001],"track_status":503,"retry_after":"2s"}}`
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{body, "@" + file} {
		_, admin := startSandboxCmd(t, "--lean", "--faults", v)
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(admin + "/admin/faults")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var f struct {
			Seed   uint64
			Report struct {
				Rate500     float64 `json:"rate_500"`
				Latency     string
				TrackIDs    []int64 `json:"track_ids"`
				TrackStatus int     `json:"track_status"`
				RetryAfter  string  `json:"retry_after"`
			}
		}
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("GET /admin/faults %s: %v", b, err)
		}
		r := f.Report
		if f.Seed != 7 || r.Rate500 != 0.01 || r.Latency != "50ms" || len(r.TrackIDs) != 1 || r.TrackIDs[0] != 400001 || r.TrackStatus != 503 || r.RetryAfter != "2s" {
			t.Fatalf("--faults %s: GET /admin/faults %s", v, b)
		}
	}
}
