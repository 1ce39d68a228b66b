//go:build linux

package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/playpipe/playpipe/internal/loopport"
)

// TestOwnExitWhy: a role that exited on its own is explained by its last
// run's exit line, found among ERROR lines and later runs' starts; a role
// stopped only by faults is not explained at all.
func TestOwnExitWhy(t *testing.T) {
	log := filepath.Join(t.TempDir(), "sink.log")
	body := strings.Join([]string{
		"=== 2026-11-29T18:00:00Z: playpipe sink --admin-addr 127.0.0.1:40001",
		"time=… level=ERROR msg=\"sink: insert\" err=\"dial tcp: refused\"",
		"playpipe sink: admin: listen tcp 127.0.0.1:40001: bind: address already in use",
		"=== 2026-11-29T18:00:02Z: playpipe sink --admin-addr 127.0.0.1:40001",
		"time=… level=INFO msg=\"sink: started\"",
		"",
	}, "\n")
	if err := os.WriteFile(log, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Role{Name: "sink", Exits: []string{"signal killed at 18:00:00", "exit 1 at 18:00:01", "exit 1 at 18:00:03", "exit 0 at 18:00:05"}}
	got := ownExitWhy(r, log)
	for _, want := range []string{"sink: 2 exits not by a fault", "the first exit 1 at 18:00:01", "the last exit 1 at 18:00:03", "bind: address already in use"} {
		if !strings.Contains(got, want) {
			t.Errorf("ownExitWhy = %q, want it to contain %q", got, want)
		}
	}
	if got := ownExitWhy(Role{Name: "report-0", Exits: []string{"signal killed at 18:00:00", "exit 0 at 18:01:00"}}, log); got != "" {
		t.Errorf("a role stopped only by faults: ownExitWhy = %q, want \"\"", got)
	}
	noLog := ownExitWhy(Role{Name: "ingest", Exits: []string{"exit 2 at 18:00:00"}}, filepath.Join(t.TempDir(), "none.log"))
	if !strings.Contains(noLog, "no error line") {
		t.Errorf("without a log: ownExitWhy = %q, want it to say there is no error line", noLog)
	}
}

// TestLastErrorLineCutsWholeCharacters: a long exit line is cut at 300
// bytes, never inside a character.
func TestLastErrorLineCutsWholeCharacters(t *testing.T) {
	log := filepath.Join(t.TempDir(), "sink.log")
	line := "playpipe sink: " + strings.Repeat("é", 200) // 2 bytes each: byte 300 is inside one
	if err := os.WriteFile(log, []byte(line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := lastErrorLine(log)
	if !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || len(got) > 300+len("…") || !strings.HasPrefix(line, strings.TrimSuffix(got, "…")) {
		t.Errorf("lastErrorLine = %q (%d bytes), want a valid prefix of at most 300 bytes and …", got, len(got))
	}
}

// TestMustAddrBelowEphemeral: the rig's listeners (roles' admin ports, the
// gateway, the sandbox) take ports below Linux's ephemeral range,
// where an outgoing connection cannot take a killed listener's port before
// it restarts on it.
func TestMustAddrBelowEphemeral(t *testing.T) {
	for range 20 {
		a := mustAddr()
		_, ps, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := strconv.Atoi(ps)
		if p < loopport.Low || p >= loopport.High {
			t.Fatalf("mustAddr = %s, want a port in [%d, %d)", a, loopport.Low, loopport.High)
		}
	}
}
