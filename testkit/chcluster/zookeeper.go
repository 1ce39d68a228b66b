package chcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/playpipe/playpipe/internal/loopport"
)

// ZooKeeperJar is where Debian's zookeeper package puts the server's jar;
// its manifest names the libraries it needs.
const ZooKeeperJar = "/usr/share/java/zookeeper.jar"

// ErrZooKeeperNotInstalled is returned (wrapped) by Start when Java or
// ZooKeeper's jar is missing.
var ErrZooKeeperNotInstalled = errors.New("chcluster: ZooKeeper is not installed (Debian/Ubuntu: apt-get install zookeeper; make test installs it)")

// ZooKeeper is a standalone ZooKeeper server process in a folder.
type ZooKeeper struct {
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// findZooKeeper returns the java binary and the jar, or an error wrapping
// ErrZooKeeperNotInstalled.
func findZooKeeper(jar string) (javaBin string, _ error) {
	if jar == "" {
		jar = ZooKeeperJar
	}
	if _, err := os.Stat(jar); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrZooKeeperNotInstalled, jar, err)
	}
	javaBin, err := exec.LookPath("java")
	if err != nil {
		return "", fmt.Errorf("%w: java: %v", ErrZooKeeperNotInstalled, err)
	}
	return javaBin, nil
}

// startZooKeeper runs ZooKeeper's ZooKeeperServerMain with a zoo.cfg in dir
// (data in dir/data) on a free loopback port and returns once `srvr`
// reports that it serves. tickTime is 500 ms: sessions may last 1–10 s, so
// a killed client's session expires within 10 s.
func startZooKeeper(ctx context.Context, dir, jar string, timeout time.Duration) (*ZooKeeper, error) {
	javaBin, err := findZooKeeper(jar)
	if err != nil {
		return nil, err
	}
	if jar == "" {
		jar = ZooKeeperJar
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, fmt.Errorf("chcluster: zookeeper folder: %w", err)
	}
	var last error
	for range 3 { // a port picked free may be taken before ZooKeeper binds it
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		cfg := "# Written by playpipe (testkit/chcluster).\n" +
			"tickTime=500\n" +
			"dataDir=" + filepath.Join(dir, "data") + "\n" +
			"clientPort=" + strconv.Itoa(port) + "\n" +
			"clientPortAddress=127.0.0.1\n" +
			"admin.enableServer=false\n" +
			"4lw.commands.whitelist=ruok,srvr\n" +
			"maxClientCnxns=0\n"
		cfgPath := filepath.Join(dir, "zoo.cfg")
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			return nil, fmt.Errorf("chcluster: write zoo.cfg: %w", err)
		}
		out, err := os.OpenFile(filepath.Join(dir, "zookeeper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("chcluster: %w", err)
		}
		cmd := exec.Command(javaBin, "-Xmx256m", "-XX:+UseSerialGC", "-Dzookeeper.admin.enableServer=false",
			"-cp", jar, "org.apache.zookeeper.server.ZooKeeperServerMain", cfgPath)
		cmd.Dir, cmd.Stdout, cmd.Stderr = dir, out, out
		cmd.SysProcAttr = procAttr()
		if err := cmd.Start(); err != nil {
			out.Close()
			return nil, fmt.Errorf("chcluster: start zookeeper: %w", err)
		}
		z := &ZooKeeper{dir: dir, port: port, cmd: cmd, exited: make(chan struct{})}
		go func() { // owner: z; ends when the process exits
			_ = cmd.Wait()
			out.Close()
			close(z.exited)
		}()
		wctx, cancel := context.WithTimeout(ctx, timeout)
		last = z.waitServing(wctx)
		cancel()
		if last == nil {
			return z, nil
		}
		z.Kill()
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("chcluster: zookeeper did not serve: %w\n--- tail of %s ---\n%s", last, filepath.Join(dir, "zookeeper.log"), tail(filepath.Join(dir, "zookeeper.log"), 2048))
}

// Addr is the client address, 127.0.0.1:port.
func (z *ZooKeeper) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(z.port)) }

// Port is the client port.
func (z *ZooKeeper) Port() int { return z.port }

// waitServing polls the four-letter word `srvr` until its answer has a
// "Mode:" line: `ruok` says imok before the server serves sessions, `srvr`
// says "not currently serving requests" until it does.
func (z *ZooKeeper) waitServing(ctx context.Context) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ans, err := z.FourLetter(ctx, "srvr")
		switch {
		case err != nil:
			last = err
		case strings.Contains(ans, "Mode: "):
			return nil
		default:
			last = fmt.Errorf("srvr answered %q", strings.TrimSpace(ans))
		}
		select {
		case <-z.exited:
			return errors.New("the zookeeper process exited during start-up")
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// FourLetter sends one of ZooKeeper's four-letter words (ruok and srvr
// are allowed) and returns the answer.
func (z *ZooKeeper) FourLetter(ctx context.Context, word string) (string, error) {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", z.Addr())
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, word); err != nil {
		return "", err
	}
	var b bytes.Buffer
	if _, err := io.Copy(&b, io.LimitReader(c, 64<<10)); err != nil {
		return b.String(), err
	}
	return b.String(), nil
}

// Kill stops the process with SIGKILL and waits for it.
func (z *ZooKeeper) Kill() {
	z.mu.Lock()
	defer z.mu.Unlock()
	select {
	case <-z.exited:
		return
	default:
	}
	_ = z.cmd.Process.Kill() // by PID
	<-z.exited
}

// freePort returns a loopback port that was free a moment ago, below the
// ephemeral range (loopport): a replica or ZooKeeper restarted on it finds
// it free.
func freePort() (int, error) {
	p, err := loopport.Pick(1)
	if err != nil {
		return 0, fmt.Errorf("chcluster: %w", err)
	}
	return p[0], nil
}

// tail returns the last n bytes of a file ("" when unreadable).
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
