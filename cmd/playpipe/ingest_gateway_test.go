package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/producer/gateway"
)

// TestIngestGatewayFlagErrors: a bad gateway limit (flag or environment)
// stops the command with a usage error that names the flag and the values
// it takes, before anything starts.
func TestIngestGatewayFlagErrors(t *testing.T) {
	key := "acme:" + gateway.HashKey("k")
	cases := []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"event size zero", "", []string{"--max-event-bytes", "0"}, "--max-event-bytes"},
		{"event size over the Kafka bound", "", []string{"--max-event-bytes", "2000000"}, "1 to 983040"},
		{"event size not a number", "", []string{"--max-event-bytes", "64KiB"}, "--max-event-bytes"},
		{"event size from the environment", "lots", nil, "PLAYPIPE_MAX_EVENT_BYTES"},
		{"per-key concurrency over the global one", "", []string{"--max-concurrent", "8", "--max-concurrent-per-key", "9"}, "--max-concurrent-per-key"},
		{"no minimum body rate", "", []string{"--min-body-rate", "0"}, "--min-body-rate"},
		{"no body grace", "", []string{"--body-grace", "0s"}, "--body-grace"},
		{"negative read timeout", "", []string{"--read-timeout", "-1s"}, "--read-timeout"},
		{"burst under a batch", "", []string{"--max-events", "100", "--burst", "10"}, "--burst"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("PLAYPIPE_MAX_EVENT_BYTES", c.env)
			var errOut bytes.Buffer
			args := append([]string{"--brokers", "127.0.0.1:1", "--api-key", key}, c.args...)
			err := runIngestWith(context.Background(), args, nil, io.Discard, &errOut, nil)
			if !errors.Is(err, errUsage) || !strings.Contains(errOut.String(), c.want) {
				t.Fatalf("err %v, stderr %q, want a usage error naming %q", err, errOut.String(), c.want)
			}
		})
	}
}
