package reporter

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi"
)

// Environment of the reporter child process (TestReporterProcess).
const (
	envChild         = "PLAYPIPE_REPORTER_CHILD"
	envChildBroker   = "PLAYPIPE_REPORTER_CHILD_BROKERS"
	envChildAPI      = "PLAYPIPE_REPORTER_CHILD_API"
	envChildGroup    = "PLAYPIPE_REPORTER_CHILD_GROUP"
	envChildRate     = "PLAYPIPE_REPORTER_CHILD_RATE"
	envChildConc     = "PLAYPIPE_REPORTER_CHILD_CONCURRENCY"
	envChildHeapProf = "PLAYPIPE_REPORTER_CHILD_HEAPPROFILE"
	envChildInstance = "PLAYPIPE_REPORTER_CHILD_INSTANCE"
	envChildPrefix   = "PLAYPIPE_REPORTER_CHILD_TOPIC_PREFIX"
	// envChildMaxConc is the child's MaxConcurrency; unset, it is the
	// concurrency: a fixed in-flight, which the bounds of the kill tests
	// count on.
	envChildMaxConc = "PLAYPIPE_REPORTER_CHILD_MAX_CONCURRENCY"
	// envChildAPITimeout is the child's API request timeout (a Go
	// duration); unset, 5 s.
	envChildAPITimeout = "PLAYPIPE_REPORTER_CHILD_API_TIMEOUT"
	// The parking kill test (park_kill_test.go): a partner that fails every
	// report of one track while a file exists, and the parking settings.
	envChildBadAPI   = "PLAYPIPE_REPORTER_CHILD_BAD_API"
	envChildBadTrack = "PLAYPIPE_REPORTER_CHILD_BAD_TRACK"
	envChildBadFile  = "PLAYPIPE_REPORTER_CHILD_BAD_WHILE"
)

// TestReporterProcess is not a test on its own: it is the reporter process
// that TestKillAndRestart (and the backlog memory run) start as a child of
// the test binary and kill. It runs until SIGTERM and exits 0 on a clean stop.
func TestReporterProcess(t *testing.T) {
	if os.Getenv(envChild) == "" {
		t.Skip("helper process, run by TestKillAndRestart")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	rate, _ := strconv.ParseFloat(os.Getenv(envChildRate), 64)
	conc, _ := strconv.Atoi(os.Getenv(envChildConc))
	maxConc, _ := strconv.Atoi(os.Getenv(envChildMaxConc))
	maxConc = max(maxConc, conc)
	apiTimeout := 5 * time.Second
	if v := os.Getenv(envChildAPITimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s: %v", envChildAPITimeout, err)
		}
		apiTimeout = d
	}
	// Straight to stderr: the parent shows it when a test fails (t.Log output
	// of a killed child would be lost).
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	api, err := partnerapi.New(partnerapi.Config{
		BaseURL:     os.Getenv(envChildAPI),
		Credentials: partnerapi.Credentials{ClientID: "playpipe01", ClientSignature: "SANDBOX-ONLY-signature-not-a-real-secret"},
		UserAgent:   testUA, MaxConns: max(maxConc, 16), RequestTimeout: apiTimeout, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	cfg := Config{
		Kafka: kafkax.Config{Brokers: strings.Split(os.Getenv(envChildBroker), ","), TopicPrefix: os.Getenv(envChildPrefix), Partitions: 1, ReplicationFactor: -1,
			InstanceID: os.Getenv(envChildInstance)},
		Group:       os.Getenv(envChildGroup),
		Concurrency: conc, MaxConcurrency: maxConc, Rate: rate,
		Logger: log,
	}
	var partner API = api
	if u := os.Getenv(envChildBadAPI); u != "" {
		partner = childBadTrack(t, log, api, u)
		cfg.ParkAfterAttempts, cfg.ParkAfter = 3, 100*time.Millisecond
		cfg.ParkRetries = []time.Duration{300 * time.Millisecond}
		cfg.BackoffInitial, cfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	}
	r, err := New(cfg, partner)
	if err != nil {
		t.Fatal(err)
	}
	r.kgoOpts = testGroupOpts
	if path := os.Getenv(envChildHeapProf); path != "" {
		// A heap profile mid-run, for the backlog memory measurement.
		go func() {
			time.Sleep(8 * time.Second) // a real wait: the profile is taken 8 s into the backlog run (PLAYPIPE_BACKLOG only)
			if f, err := os.Create(path); err == nil {
				_ = pprof.WriteHeapProfile(f)
				f.Close()
			}
		}()
	}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// child is a reporter running in a child process.
type child struct {
	cmd *exec.Cmd
	out *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (e *e2e) startChild(rate float64, conc int, extraEnv ...string) *child {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestReporterProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envChild+"=1",
		envChildBroker+"="+strings.Join(e.kafka.Config.Brokers, ","),
		envChildPrefix+"="+e.kafka.Config.TopicPrefix,
		envChildAPI+"="+e.sb.URL,
		envChildGroup+"="+e.group,
		envChildRate+"="+fmt.Sprint(rate),
		envChildConc+"="+strconv.Itoa(conc),
	)
	cmd.Env = append(cmd.Env, extraEnv...)
	c := &child{cmd: cmd, out: &lockedBuffer{}}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start reporter process: %v", err)
	}
	e.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return c
}

// TestKillAndRestart: the reporter process is killed with SIGKILL mid-run
// and started again. Every report ends in the ledger; the only reports sent
// twice are those in flight (posted, not yet committed) at the kill, and
// the test reports how many.
func TestKillAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	const (
		n    = 3000
		rate = 2000.0
		conc = 16
	)
	e := newE2EApache(t, 3)
	e.group = "reporter-kill"
	e.publish("kill", n, 0, 0)
	first := e.startChild(rate, conc)
	waitFor(t, 60*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= n/3 })
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()
	atKill := e.sb.Ledger().AcceptedCount
	committedAtKill, _ := e.committed()
	var sum int64
	for _, o := range committedAtKill {
		sum += o
	}
	t.Logf("killed (SIGKILL) after %d reports accepted; %d committed", atKill, sum)
	if sum == 0 {
		t.Error("nothing committed before the kill: the reporter must commit as it goes")
	}

	second := e.startChild(rate, conc)
	e.waitRestartDone(90*time.Second, 60*time.Second)
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.cmd.Wait(); err != nil {
		t.Fatalf("restarted reporter did not stop cleanly: %v\n%s", err, second.out.String())
	}
	dups := e.checkExactlyOnce(true)
	e.checkAllCommitted()
	e.checkDeliveries(false)
	t.Logf("records with a doubt cause: %v", e.checkCopies())
	// Sent twice = in flight at the kill: posted (≤ concurrency) or final
	// but not yet committed (about one produce + commit round trip at the
	// rate). 100 ms of finality lag at 2000/s is 200 reports.
	bound := int(conc + rate*0.1)
	t.Logf("kill -9 then restart: %d of %d reports sent twice (bound %d = concurrency %d + 100ms at %.0f/s)", dups, n, bound, conc, rate)
	if int64(dups) != int64(e.sb.Ledger().Duplicates) {
		t.Errorf("ledger duplicates %d, counted %d", e.sb.Ledger().Duplicates, dups)
	}
	if dups > bound {
		t.Errorf("%d reports sent twice, more than in flight (bound %d)", dups, bound)
	}
	if t.Failed() {
		t.Logf("first process output:\n%s\nsecond process output:\n%s", first.out.String(), second.out.String())
	}
}
