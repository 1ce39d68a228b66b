package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func TestParseMixes(t *testing.T) {
	got, err := parseMixes("101:60m@0/4m/9m30s, 7:5000")
	want := []simulator.MixInfo{{ID: 101, LengthMS: 3_600_000, TrackStartsMS: []int64{0, 240_000, 570_000}}, {ID: 7, LengthMS: 5000}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%v %+v", err, got)
	}
	for _, bad := range []string{"", "101", "x:10m", "1:ten", "1:10m@x", "1:-5"} {
		if _, err := parseMixes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSimulateCommandWithMixes(t *testing.T) {
	k := testenv.StartKafka(t, 2)
	rec := filepath.Join(t.TempDir(), "sent.ndjson")
	var out bytes.Buffer
	err := runSimulate(context.Background(), []string{"--brokers", strings.Join(k.Config.Brokers, ","), "--events", "400",
		"--mixes", "101:30m@0/5m/12m,102:1h", "--bad-share", "0.25", "--seed", "9", "--record", rec, "--log-level", "warn"}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "sent 400 events") || !strings.Contains(out.String(), "malformed_json=") {
		t.Fatalf("printed %q", out.String())
	}
	f, err := os.Open(rec)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		lines++
	}
	if lines != 400 {
		t.Fatalf("--record holds %d lines", lines)
	}
	if n := len(k.ReadAll(t, k.Config.Topics().Events)); n != 400 {
		t.Fatalf("topic holds %d records", n)
	}
	if err := runSimulate(context.Background(), []string{"--events", "1", "--mixes", "1:1h"}, io.Discard, io.Discard); !errors.Is(err, errUsage) {
		t.Fatalf("without --brokers: %v", err)
	}
}

// TestSimulateCommandWalksBuiltinSandbox: with --sandbox (no --mixes, no
// --api-url) the command walks a built-in sandbox through the partner API
// client.
func TestSimulateCommandWalksBuiltinSandbox(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	var out bytes.Buffer
	err := runSimulate(context.Background(), []string{"--brokers", strings.Join(k.Config.Brokers, ","), "--events", "150",
		"--sandbox", "--max-mixes", "10", "--bad-share", "0", "--log-level", "warn"}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "sent 150 events") || !strings.Contains(out.String(), "valid=150") {
		t.Fatalf("printed %q", out.String())
	}
}
