package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

func init() {
	register(command{
		name:    "sandbox",
		summary: "run the partner API sandbox (faithful emulator of every endpoint) with its admin API",
		run:     runSandbox,
	})
}

const sandboxSynopsis = `Serves an emulator of the partner API (docs/partnerapi.md; the partner's specification v2.0.0): sessions,
catalog, page, list, genre row, mix and play reports, with the spec's shapes, statuses and
messages; standby and live-bypass modes; an edge layer that blocks default script
User-Agents (403, edge error 1010); injectable faults; and a ledger of every report.
The credentials below are sandbox-only values, not secrets. Full guide: docs/sandbox.md.

Example (in another shell):
  curl -sA 'playpipe/0.1.0 (partner integration)' -H 'Content-Type: application/json' \
    -d '{"client_id":"playpipe01","client_signature":"SANDBOX-ONLY-signature-not-a-real-secret"}' \
    http://127.0.0.1:8088/partners/session`

// sandboxFlags are the flags of playpipe sandbox.
type sandboxFlags struct {
	lf                               logFlags
	addr, adminAddr                  string
	adminPublic, empty, lean, strict bool
	seed                             int64
	clientID, clientSig, email       string
	secretFile, modeName             string
	faults                           string
	adminHosts                       string
	liveTTL, standbyTTL              time.Duration
	pages, lists, mixes, maxLedger   int
}

func (f *sandboxFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "addr", envDefault("PLAYPIPE_SANDBOX_ADDR", "127.0.0.1:8088"), "API listen address (env PLAYPIPE_SANDBOX_ADDR)")
	fs.StringVar(&f.adminAddr, "admin-addr", envDefault("PLAYPIPE_SANDBOX_ADMIN_ADDR", "127.0.0.1:9465"), "admin API listen address (env PLAYPIPE_SANDBOX_ADMIN_ADDR); must be loopback unless --admin-public; \"off\" disables it")
	fs.BoolVar(&f.adminPublic, "admin-public", false, "allow the admin API on a non-loopback address and answer non-loopback callers")
	fs.StringVar(&f.adminHosts, "admin-host", "", "further comma-separated host names the admin API answers in the Host header (e.g. a service name with --admin-public); its own address and localhost always pass, any other Host is refused (DNS rebinding)")
	fs.Int64Var(&f.seed, "seed", 1, "catalog seed: the same seed always yields the same catalog")
	fs.StringVar(&f.clientID, "client-id", envDefault("PLAYPIPE_SANDBOX_CLIENT_ID", sandbox.DefaultClientID), "client_id the session endpoints accept, 10 characters (env PLAYPIPE_SANDBOX_CLIENT_ID)")
	fs.StringVar(&f.clientSig, "client-signature", envDefault("PLAYPIPE_SANDBOX_CLIENT_SIGNATURE", sandbox.DefaultClientSignature), "client_signature the session endpoints accept, 40 characters (env PLAYPIPE_SANDBOX_CLIENT_SIGNATURE)")
	fs.StringVar(&f.email, "email", envDefault("PLAYPIPE_SANDBOX_EMAIL", sandbox.DefaultEmail), "partner account e-mail for /partners/session/with-user (env PLAYPIPE_SANDBOX_EMAIL)")
	fs.StringVar(&f.secretFile, "jwt-secret-file", "", "file holding the HS256 signing secret (≥ 16 bytes); default: random per run, so tokens die on restart")
	fs.DurationVar(&f.liveTTL, "live-token-ttl", sandbox.DefaultLiveTokenTTL, "lifetime of tokens minted in live and live-bypass mode")
	fs.DurationVar(&f.standbyTTL, "standby-token-ttl", sandbox.DefaultStandbyTokenTTL, "lifetime of tokens minted in standby")
	fs.StringVar(&f.modeName, "mode", "live", "starting mode: live, standby or live-bypass")
	fs.StringVar(&f.faults, "faults", "", "injected faults to start with (and return to on POST /admin/reset): the JSON body of PUT /admin/faults, or @FILE holding it; e.g. '{\"report\":{\"rate_500\":0.01,\"latency\":\"50ms\",\"track_ids\":[400001],\"seed\":7}}' (docs/sandbox.md, Faults)")
	fs.IntVar(&f.pages, "pages", sandbox.DefaultPages, "content pages in the catalog (1–100; one empty page is always added)")
	fs.IntVar(&f.lists, "lists-per-page", sandbox.DefaultListsPerPage, "lists per page (1–50)")
	fs.IntVar(&f.mixes, "mixes-per-list", sandbox.DefaultMixesPerList, "mixes per list (1–100)")
	fs.BoolVar(&f.empty, "empty-catalog", false, "answer GET /partners/catalog with 400 \"no catalogs available\"")
	fs.IntVar(&f.maxLedger, "max-ledger-entries", 0, fmt.Sprintf("report entries kept with their bodies; beyond, only counted (0: %d, or %d with --lean)", sandbox.DefaultMaxLedgerEntries, sandbox.LeanMaxLedgerEntries))
	fs.BoolVar(&f.lean, "lean", false, "lean mode for load tests: no otelhttp tracing middleware, and a bounded ledger (detail of the first --max-ledger-entries reports only; counts and duplicates exact)")
	fs.BoolVar(&f.strict, "strict", true, "strict mode: shuffled rankings, gapped page and list ids, 415 for non-JSON POST bodies, 400 for non-canonical path ids, 401 for repeated Authorization headers; --strict=false serves the catalog sorted and lets those pass")
	f.lf.register(fs.StringVar)
}

// adminOn reports whether the admin API is to be served.
func (f *sandboxFlags) adminOn() bool { return f.adminAddr != "" && f.adminAddr != "off" }

// options checks the flags and returns the sandbox's options; a usage
// error is written to stderr and returned as errUsage.
func (f *sandboxFlags) options(log *slog.Logger, stderr io.Writer) (sandbox.Config, error) {
	mode, err := sandbox.ParseMode(f.modeName)
	if err != nil {
		fmt.Fprintf(stderr, "--mode: %v\n", err)
		return sandbox.Config{}, errUsage
	}
	if f.adminOn() && !f.adminPublic && !loopbackAddr(f.adminAddr) {
		fmt.Fprintf(stderr, "--admin-addr %q is not a loopback address: pass --admin-public to expose the admin API\n", f.adminAddr)
		return sandbox.Config{}, errUsage
	}
	opts := sandbox.Config{
		Seed: f.seed, ClientID: f.clientID, ClientSignature: f.clientSig, Email: f.email,
		LiveTokenTTL: f.liveTTL, StandbyTokenTTL: f.standbyTTL, Logger: log, Mode: mode,
		Pages: f.pages, ListsPerPage: f.lists, MixesPerList: f.mixes, EmptyCatalog: f.empty,
		MaxLedgerEntries: f.maxLedger, AdminAllowRemote: f.adminPublic, Lenient: !f.strict, Lean: f.lean,
	}
	for _, h := range strings.Split(f.adminHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			opts.AdminHosts = append(opts.AdminHosts, h)
		}
	}
	if f.maxLedger < 0 {
		fmt.Fprintf(stderr, "--max-ledger-entries %d: accepted 0 (the default) or more\n", f.maxLedger)
		return opts, errUsage
	}
	if f.faults != "" {
		fl, err := parseFaults(f.faults)
		if err != nil {
			fmt.Fprintf(stderr, "--faults: %v\n", err)
			return opts, errUsage
		}
		opts.Faults = fl
	}
	if f.secretFile != "" {
		b, err := os.ReadFile(f.secretFile)
		if err != nil {
			return opts, fmt.Errorf("--jwt-secret-file: %w", err)
		}
		opts.JWTSecret = b
	}
	return opts, nil
}

func runSandbox(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sandbox", stderr, sandboxSynopsis)
	var f sandboxFlags
	f.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: playpipe sandbox [flags]\n\n%s\n\nFlags:\n", sandboxSynopsis)
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\n%s\n", sandbox.AdminUsage)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := f.lf.logger(stderr)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	opts, err := f.options(log, stderr)
	if err != nil {
		return err
	}
	srv, err := sandbox.New(opts)
	if err != nil {
		return fmt.Errorf("%w (check the matching flag)", err)
	}
	tel, stopTel, err := sandboxTelemetry(ctx, srv)
	if err != nil {
		return err
	}
	defer stopTel()

	ls := &listeners{log: log, errc: make(chan error, 2)}
	api := func(listenAddr string) http.Handler {
		if f.lean {
			return srv.Handler() // no tracing middleware: the partner side must not eat a load test's cores
		}
		return pinHost(telemetry.HTTPHandler(srv.Handler(), "sandbox", tel), listenAddr)
	}
	if err := ls.start("api", f.addr, api); err != nil {
		return err
	}
	if f.adminOn() {
		admin := http.NewServeMux()
		admin.Handle("/metrics", telemetry.MetricsHandler())
		admin.Handle("/", srv.AdminHandler())
		if err := ls.start("admin", f.adminAddr, func(string) http.Handler { return admin }); err != nil {
			ls.shutdown()
			return err
		}
	}
	log.Info("sandbox ready", "mode", opts.Mode.String(), "faults", f.faults != "", "strict", f.strict, "lean", f.lean, "seed", f.seed, "mixes", len(srv.Catalog().Mixes), "client_id", f.clientID)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-ls.errc:
	}
	ls.shutdown()
	l := srv.Ledger()
	log.Info("sandbox stopped", "accepted", l.AcceptedCount, "standby", l.StandbyCount, "rejected", l.RejectedCount, "duplicates", l.Duplicates)
	return runErr
}

// sandboxTelemetry sets up the OTEL_* export of server spans and metrics
// and returns the providers for the HTTP middleware; the sandbox's counters
// are also served as /metrics on the admin listener. stop unregisters them
// and shuts the export down.
func sandboxTelemetry(ctx context.Context, srv *sandbox.Server) (_ telemetry.Providers, stop func(), _ error) {
	tel, shutdownTel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "playpipe-sandbox"})
	if err != nil {
		return telemetry.Providers{}, nil, fmt.Errorf("telemetry: %w", err)
	}
	closeTel := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdownTel(sctx)
	}
	reg, err := srv.RegisterMetrics(tel.Meter.Meter("github.com/playpipe/playpipe/partnerapi/sandbox"))
	if err != nil {
		closeTel()
		return telemetry.Providers{}, nil, err
	}
	return tel, func() {
		_ = reg.Unregister()
		closeTel()
	}, nil
}

// listeners are the sandbox's HTTP servers; errc receives the end of each.
type listeners struct {
	log     *slog.Logger
	servers []*http.Server
	errc    chan error
}

// start serves, on a listener at a, the handler wrap returns for the
// listener's address.
func (ls *listeners) start(name, a string, wrap func(addr string) http.Handler) error {
	ln, err := net.Listen("tcp", a)
	if err != nil {
		return fmt.Errorf("%s listen %s: %w", name, a, err)
	}
	hs := &http.Server{Handler: wrap(ln.Addr().String()), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	ls.servers = append(ls.servers, hs)
	ls.log.Info("sandbox listening", "listener", name, "url", "http://"+ln.Addr().String())
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			ls.errc <- fmt.Errorf("%s: %w", name, err)
			return
		}
		ls.errc <- nil
	}()
	return nil
}

// shutdown shuts every server down within 5 s, closing those that do not.
func (ls *listeners) shutdown() {
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, hs := range ls.servers {
		if err := hs.Shutdown(sctx); err != nil {
			_ = hs.Close()
		}
	}
}

// pinHost serves h with the request's Host replaced by the listener's own
// address. otelhttp labels its http.server.* metrics with server.address and
// server.port taken from the Host header, which the caller chooses: random
// Host values would each open new series and grow /metrics without bound.
// The sandbox's handlers never read Host, and every other label
// (method, status, protocol, the sandbox's endpoint names) is from a fixed
// set. The request is copied shallowly, as http.StripPrefix does.
func pinHost(h http.Handler, listenAddr string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r2 := new(http.Request)
		*r2 = *r
		r2.Host = listenAddr
		h.ServeHTTP(w, r2)
	})
}

// parseFaults reads --faults: the JSON of PUT /admin/faults, or @FILE
// holding it; unknown fields and invalid values are refused.
func parseFaults(v string) (sandbox.Faults, error) {
	var f sandbox.Faults
	b := []byte(v)
	if name, ok := strings.CutPrefix(v, "@"); ok {
		var err error
		if b, err = os.ReadFile(name); err != nil {
			return f, fmt.Errorf("reading the faults: %w", err)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return f, fmt.Errorf("decoding the faults: %w", err)
	}
	if err := f.Validate(); err != nil {
		return f, err
	}
	return f, nil
}

// loopbackAddr reports whether a listen address binds loopback only.
func loopbackAddr(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	if _, err := strconv.Atoi(port); err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
