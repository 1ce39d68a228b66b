package main

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/wiring/roles"
)

func TestKafkaFlagsNeverTakeThePassword(t *testing.T) {
	t.Setenv("PLAYPIPE_KAFKA_PASSWORD", "s3cret")
	t.Setenv("PLAYPIPE_BROKERS", "a:1, b:2")
	var c kafkax.Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	registerKafkaFlags(fs, &c)
	if fs.Lookup("kafka-password") != nil {
		t.Fatal("a password flag would put the secret on command lines")
	}
	if err := fs.Parse([]string{"--topic-prefix", "p"}); err != nil {
		t.Fatal(err)
	}
	if c.SASLPassword != "s3cret" || strings.Join(c.Brokers, ",") != "a:1,b:2" || c.TopicPrefix != "p" {
		t.Fatalf("config from env and flags: %+v", c)
	}
}

// TestPartnerFlagsEnvAndFile: flag over environment over credentials file
// (partnerapi.New fills from the file what flags and environment left
// empty); the signature has no flag; a bad environment value is a usage
// error naming the variable, before anything starts.
func TestPartnerFlagsEnvAndFile(t *testing.T) {
	const sig = "S3CRET-signature-0123456789abcdefghijklm" // 40 characters
	jsonFile := filepath.Join(t.TempDir(), "creds.json")
	if err := os.WriteFile(jsonFile, []byte(`{"client_id":"fromfile01","client_signature":"`+sig+`","email":"f@example.com"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envAPIURL, "http://127.0.0.1:9")
	t.Setenv(envAPIClientID, "fromenv001")
	t.Setenv(envAPIClientSignature, "")
	t.Setenv(envAPIMaxConns, "8")
	var api apiTarget
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	api.register(fs, "use")
	if fs.Lookup("api-client-signature") != nil {
		t.Fatal("the signature has a flag")
	}
	if err := fs.Parse([]string{"--api-credentials-file", jsonFile, "--api-timeout", "3s"}); err != nil {
		t.Fatal(err)
	}
	got := api.cfg
	if got.BaseURL != "http://127.0.0.1:9" || got.Credentials.ClientID != "fromenv001" || got.Credentials.ClientSignature != "" ||
		got.CredentialsFile != jsonFile || got.MaxConns != 8 || got.RequestTimeout.String() != "3s" {
		t.Fatalf("precedence flag > env broken: %+v", got)
	}
	if err := api.check(); err != nil {
		t.Fatal(err)
	}
	p, err := roles.OpenPartner(roles.PartnerConfig{API: api.cfg}, nil)
	if err != nil {
		t.Fatalf("the file did not fill the signature: %v", err)
	}
	p.Close()

	// The signature from the environment.
	t.Setenv(envAPIClientSignature, "Z"+sig[1:])
	api = apiTarget{}
	api.register(flag.NewFlagSet("t", flag.ContinueOnError), "use")
	if api.cfg.Credentials.ClientSignature != "Z"+sig[1:] {
		t.Fatalf("signature not read from %s", envAPIClientSignature)
	}

	// Bad environment values are usage errors naming the variable.
	t.Setenv(envAPIMaxConns, "many")
	api = apiTarget{}
	api.register(flag.NewFlagSet("t", flag.ContinueOnError), "use")
	if err := api.check(); err == nil || !strings.Contains(err.Error(), envAPIMaxConns) {
		t.Fatalf("err = %v", err)
	}
}

// TestClickHouseFlagsFromEnv: the --clickhouse-* defaults come from the
// environment (no library package reads it), the password from the
// environment only, and a server binary that is not one is refused naming
// its path.
func TestClickHouseFlagsFromEnv(t *testing.T) {
	t.Setenv(envClickHouseData, "/from/env")
	t.Setenv(envClickHousePassword, "s3cret")
	t.Setenv(envClickHouseBin, "/nonexistent/clickhouse-server")
	var c analytics.Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	registerClickHouseFlags(fs, &c)
	if fs.Lookup("clickhouse-password") != nil {
		t.Fatal("a password flag would put the secret on command lines")
	}
	dir := t.TempDir()
	if err := fs.Parse([]string{"--clickhouse-data", dir}); err != nil {
		t.Fatal(err)
	}
	if c.DataDir != dir || c.Password != "s3cret" || c.ServerBinary != "/nonexistent/clickhouse-server" {
		t.Fatalf("config from env and flags: DataDir %q, password set %v, ServerBinary %q", c.DataDir, c.Password != "", c.ServerBinary)
	}
	_, stop, err := localOrConfigured(context.Background(), c, nil)
	stop()
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/clickhouse-server") {
		t.Fatalf("err = %v, want one naming the binary", err)
	}
}
