package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/playpipe/playpipe/internal/telemetry"
)

// Flags and environment variables are bound here, in cmd/playpipe, and
// nowhere else: the library packages take plain configuration structs
// (kafkax.Config, analytics.Config, partnerapi.Config, reporter.Config, …)
// which the flags_*.go files of this package fill. No library package knows
// a variable's name: the names are constants here, the libraries' errors
// name the flags, and requireKafka, requireClickHouse, localOrConfigured and
// the partner target add the variables to them. Every PLAYPIPE_*
// variable is a flag default named in that flag's help; the secrets
// (PLAYPIPE_KAFKA_PASSWORD, PLAYPIPE_CLICKHOUSE_PASSWORD,
// PLAYPIPE_API_CLIENT_SIGNATURE) are read from the environment only, never
// from a flag. OpenTelemetry's own OTEL_* variables are read by the
// OpenTelemetry SDK inside internal/telemetry, as the SDK specifies.

// envDefault returns the environment variable k, or def when it is unset or
// empty: the default of a flag named after k in its help.
func envDefault(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// splitList splits a comma separated flag or environment value, dropping
// blanks.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// adminAddrFlag binds --admin-addr for role on fs and returns where the
// value lands: the default is $PLAYPIPE_ADMIN_ADDR, else
// telemetry.DefaultAdminAddrs[role] (else 127.0.0.1:9460). "off" (or "")
// disables the admin server.
func adminAddrFlag(fs *flag.FlagSet, role string) *string {
	def := os.Getenv("PLAYPIPE_ADMIN_ADDR")
	if def == "" {
		def = telemetry.DefaultAdminAddrs[role]
	}
	if def == "" {
		def = "127.0.0.1:9460"
	}
	return fs.String("admin-addr", def, "admin HTTP listen address serving /metrics, /healthz, /readyz (env PLAYPIPE_ADMIN_ADDR); \"off\" disables; use :port to listen beyond loopback")
}

// pprofFlag binds --pprof: net/http/pprof on the admin listener.
func pprofFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("pprof", os.Getenv("PLAYPIPE_PPROF") == "true",
		"serve net/http/pprof under /debug/pprof/ on the admin listener (env PLAYPIPE_PPROF=true); off by default")
}

// requireServer reports a store's configuration that does not validate, or
// that names no server to reach (require), as a usage error; the message of
// the latter is prefixed with prefix and a colon.
func requireServer(validate, require func() error, prefix string) error {
	if err := validate(); err != nil {
		return usageError{err}
	}
	if err := require(); err != nil {
		return usageError{fmt.Errorf("%s: %w", prefix, err)}
	}
	return nil
}

// envParsed returns the environment variable k parsed by parse, or def when
// it is unset or empty. A value that does not parse leaves def and is
// joined to *errs as "<prefix>: env K="v": want <want>".
func envParsed[T any](k string, def T, parse func(string) (T, error), prefix, want string, errs *error) T {
	v := os.Getenv(k)
	if v == "" {
		return def
	}
	t, err := parse(v)
	if err != nil {
		*errs = errors.Join(*errs, fmt.Errorf("%s: env %s=%q: want %s", prefix, k, v, want))
		return def
	}
	return t
}
