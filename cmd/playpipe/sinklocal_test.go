package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/chlocal"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// readyz returns the status and body of GET /readyz (0 when no answer).
func readyz(admin string) (int, string) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + admin + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// chState is the local server's record in its folder (internal/chlocal).
type chState struct {
	PID      int `json:"pid"`
	TCPPort  int `json:"tcp_port"`
	HTTPPort int `json:"http_port"`
}

func readState(t *testing.T, dir string) (chState, []byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "server.json"))
	if err != nil {
		t.Fatalf("the local server's record: %v", err)
	}
	var st chState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st, b
}

// TestSinkReadyzFailsWhileClickHouseIsUnreachable: the sink runs (waiting
// for ClickHouse) but /readyz answers 503 naming clickhouse, while /healthz
// answers 200.
func TestSinkReadyzFailsWhileClickHouseIsUnreachable(t *testing.T) {
	clearTargetEnv(t)
	k := testenv.StartKafka(t, 1)
	admin := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- runMain(ctx, []string{"sink", "--brokers", strings.Join(k.Config.Brokers, ","), "--clickhouse-addr", freeAddr(t),
			"--admin-addr", admin, "--log-level", "error", "--retry-max", "200ms"}, io.Discard, &errb)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := readyz(admin)
		if code == http.StatusServiceUnavailable && strings.Contains(body, "clickhouse") {
			break
		}
		if code == http.StatusOK {
			t.Fatalf("/readyz answered ready with ClickHouse unreachable: %q", body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d %q", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// It stays not ready: a negative wait (more than two --retry-max
	// periods during which /readyz may not turn 200), nothing to poll for.
	time.Sleep(500 * time.Millisecond)
	if code, body := readyz(admin); code != http.StatusServiceUnavailable || !strings.Contains(body, "clickhouse") {
		t.Fatalf("/readyz later: %d %q, want 503 naming clickhouse", code, body)
	}
	if resp, err := http.Get("http://" + admin + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz: %v %v", resp, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("sink exited %d; stderr:\n%s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sink did not stop")
	}
}

// TestSinkKeepsItsLocalClickHouseRunning: `playpipe sink --clickhouse-data
// DIR` becomes ready only once its local server answers; `playpipe migrate
// --clickhouse-data DIR` meanwhile reuses that server (same pid and ports,
// record untouched); the server killed by pid is restarted by the sink on
// the same ports and rows keep arriving.
func TestSinkKeepsItsLocalClickHouseRunning(t *testing.T) {
	if _, err := chlocal.FindBinary(); errors.Is(err, chlocal.ErrNotInstalled) {
		t.Skip(err)
	}
	clearTargetEnv(t)
	k := testenv.StartKafka(t, 2)
	dir := t.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "playpipe-sinklocal-"); err == nil {
			dir = d
			t.Cleanup(func() { _ = os.RemoveAll(d) })
		}
	}
	admin := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- runMain(ctx, []string{"sink", "--brokers", strings.Join(k.Config.Brokers, ","), "--clickhouse-data", dir,
			"--partitions", "2", "--linger", "50ms", "--batch-rows", "20", "--retry-max", "300ms", "--admin-addr", admin, "--log-level", "warn"},
			io.Discard, &errb)
	}()
	waitReady := func(what string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			code, body := readyz(admin)
			if code == http.StatusOK {
				return
			}
			select {
			case c := <-done:
				t.Fatalf("%s: sink exited %d; stderr:\n%s", what, c, errb.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: /readyz %d %q after 60 s; stderr:\n%s", what, code, body, errb.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitReady("start")
	st, record := readState(t, dir)
	if syscall.Kill(st.PID, 0) != nil {
		t.Fatalf("ready, but the recorded server (pid %d) is not running", st.PID)
	}

	prod := k.Client(t)
	sent := 0
	publish := func(n int) {
		t.Helper()
		var recs []*kgo.Record
		for range n {
			recs = append(recs, &kgo.Record{Topic: k.Config.Topics().Events, Value: fmt.Appendf(nil, `{"event_id":"local-%d"}`, sent)})
			sent++
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	addr := fmt.Sprintf("127.0.0.1:%d", st.TCPPort)
	waitRows := func(what string, want uint64) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		var n uint64
		var err error
		for {
			n, err = countEvents(ctx, addr)
			if err == nil && n == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d event rows (err %v), want %d; sink stderr:\n%s", what, n, err, want, errb.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	publish(40)
	waitRows("before the kill", 40)

	// migrate on the same folder reuses the running server.
	var mout, merr bytes.Buffer
	if code := runMain(ctx, []string{"migrate", "--clickhouse-data", dir, "--log-level", "warn"}, &mout, &merr); code != 0 || !strings.Contains(mout.String(), "nothing to apply") {
		t.Fatalf("migrate on the running folder: exit %d, stdout %q, stderr %q", code, mout.String(), merr.String())
	}
	if st2, rec2 := readState(t, dir); st2 != st || !bytes.Equal(rec2, record) || syscall.Kill(st.PID, 0) != nil {
		t.Fatalf("migrate changed the folder's server: %s → %s (pid %d alive: %v)", record, rec2, st.PID, syscall.Kill(st.PID, 0) == nil)
	}
	waitReady("after migrate")

	// Kill the server by pid: the sink restarts it on the same ports.
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	publish(40)
	deadline := time.Now().Add(60 * time.Second)
	for {
		st2, _ := readState(t, dir)
		if st2.PID != st.PID && syscall.Kill(st2.PID, 0) == nil {
			if st2.TCPPort != st.TCPPort || st2.HTTPPort != st.HTTPPort {
				t.Fatalf("restarted on other ports: %+v, was %+v", st2, st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed server was not restarted within 60 s; sink stderr:\n%s", errb.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitReady("after the restart")
	waitRows("after the restart", 80)
	publish(20)
	waitRows("later", 100)

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("sink exited %d; stderr:\n%s", code, errb.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("sink did not stop within 60 s")
	}
	if !strings.Contains(errb.String(), "restarting it on the same ports") {
		t.Errorf("the restart was not logged:\n%s", errb.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "server.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the sink stopped, the folder still records a server (err %v)", err)
	}
}

// countEvents counts the distinct event records in the default ledger
// database of the server at addr.
func countEvents(ctx context.Context, addr string) (uint64, error) {
	conn, err := analytics.Config{Addr: addr}.Open()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n uint64
	err = conn.QueryRow(qctx, "SELECT uniqExact(kafka_partition, kafka_offset) FROM "+analytics.DefaultDatabase+".events").Scan(&n)
	return n, err
}
