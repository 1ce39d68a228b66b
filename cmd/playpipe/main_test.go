package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// TestMain gives every role run by these tests an admin server on a free
// loopback port instead of its fixed default, so tests never collide with
// each other or with a playpipe running on the machine.
func TestMain(m *testing.M) {
	if os.Getenv("PLAYPIPE_ADMIN_ADDR") == "" {
		os.Setenv("PLAYPIPE_ADMIN_ADDR", "127.0.0.1:0")
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// TestUsageAndExitCodes: the top-level CLI contract: no command is
// a usage error, `help <command>` prints that command's help, a bad flag is one
// short message naming it, and a bad Kafka flag exits 2 in every role.
func TestUsageAndExitCodes(t *testing.T) {
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := runMain(context.Background(), args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	if code, _, errOut := run(); code != 2 || !strings.Contains(errOut, "Usage: playpipe <command>") {
		t.Errorf("no arguments: exit %d, stderr %q; want 2 and the usage", code, errOut)
	}
	if code, out, _ := run("help"); code != 0 || !strings.Contains(out, "Usage: playpipe <command>") {
		t.Errorf("help: exit %d; want 0 and the usage on stdout", code)
	}
	for _, c := range []string{"sink", "audit", "demo"} {
		code, out, _ := run("help", c)
		if code != 0 || !strings.Contains(out, "Usage: playpipe "+c+" [flags]") || !strings.Contains(out, "Flags:\n  -") {
			t.Errorf("help %s: exit %d, stdout %q; want 0 and the command's help", c, code, firstLines(out, 3))
		}
	}
	if code, _, errOut := run("help", "nope"); code != 2 || !strings.Contains(errOut, `"nope"`) {
		t.Errorf("help nope: exit %d, %q", code, errOut)
	}
	for _, c := range []string{"sink", "audit", "consume", "report", "demo", "simulate", "sandbox"} {
		code, _, errOut := run(c, "--no-such-flag")
		lines := strings.Count(strings.TrimSpace(errOut), "\n") + 1
		if code != 2 || !strings.Contains(errOut, "-no-such-flag") || !strings.Contains(errOut, "see playpipe "+c+" --help") || lines > 3 {
			t.Errorf("%s --no-such-flag: exit %d, %d lines %q; want 2 and a short message naming the flag", c, code, lines, errOut)
		}
	}
	for _, c := range []string{"sink", "consume", "report", "demo", "simulate"} {
		code, _, errOut := run(c, "--kafka-sasl", "NOPE", "--brokers", "127.0.0.1:1")
		if code != 2 || !strings.Contains(errOut, "--kafka-sasl") {
			t.Errorf("%s --kafka-sasl NOPE: exit %d, %q; want 2 naming the flag", c, code, errOut)
		}
	}
	code, out, _ := run("help", "simulate")
	if code != 0 || strings.Contains(out, "embedded-kafka") || strings.Contains(out, "embedded in-memory broker") || strings.Contains(out, "embedded in-process") {
		t.Errorf("simulate --help documents the embedded broker it refuses:\n%s", out)
	}
}

func firstLines(s string, n int) string {
	ls := strings.SplitN(s, "\n", n+1)
	if len(ls) > n {
		ls = ls[:n]
	}
	return strings.Join(ls, "\n")
}
