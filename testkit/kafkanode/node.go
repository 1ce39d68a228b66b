package kafkanode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// Node is one KRaft node of a Cluster: a combined broker and controller,
// a JVM child process.
type Node struct {
	// ID is the node.id; Broker and Controller are its listeners, host:port.
	ID                 int
	Broker, Controller string

	dir     string
	install Install
	heap    string
	prefix  []string // a command the JVM runs under (Config.Prefix)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process of cmd has exited
	frozen bool
}

// LogPath is the node's own log, appended to across restarts.
func (n *Node) LogPath() string { return filepath.Join(n.dir, "node.log") }

// PID is the process id of the running JVM, 0 when it is not running.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil || n.isExited() {
		return 0
	}
	return n.cmd.Process.Pid
}

// Running says whether the JVM is alive (frozen counts as alive).
func (n *Node) Running() bool { return n.PID() != 0 }

func (n *Node) isExited() bool {
	select {
	case <-n.exited:
		return true
	default:
		return false
	}
}

// start launches the JVM; it does not wait for readiness.
func (n *Node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && !n.isExited() {
		return fmt.Errorf("kafkanode: node %d is already running (pid %d)", n.ID, n.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(n.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("kafkanode: node %d log: %w", n.ID, err)
	}
	args := append(n.install.jvmArgs(n.heap, n.dir), "kafka.Kafka", filepath.Join(n.dir, "server.properties"))
	cmd := exec.Command(n.install.Java, args...)
	if len(n.prefix) > 0 {
		cmd = exec.Command(n.prefix[0], append(append(n.prefix[1:len(n.prefix):len(n.prefix)], n.install.Java), args...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr()
	cmd.Env = append(os.Environ(), "KAFKA_LOG4J_OPTS=", "KAFKA_HEAP_OPTS=")
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("kafkanode: start node %d: %w", n.ID, err)
	}
	exited := make(chan struct{})
	n.cmd, n.exited, n.frozen = cmd, exited, false
	// The waiter is owned by the node: it ends when the process exits,
	// which Kill, Stop and Close ensure.
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	return nil
}

// Stop asks the node to shut down (SIGTERM: a controlled shutdown that
// moves its leaderships away) and waits; when ctx ends first it kills it.
func (n *Node) Stop(ctx context.Context) error {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	if n.frozen && cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		n.frozen = false
	}
	n.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		n.Kill()
		return fmt.Errorf("kafkanode: node %d did not stop on SIGTERM in time, killed: %w", n.ID, ctx.Err())
	}
}

// Kill ends the node at once (SIGKILL: a crash, nothing flushed) and waits
// for the process to be gone.
func (n *Node) Kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.frozen = false
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Freeze stops the JVM with SIGSTOP: its sockets stay open and nothing
// answers, as with a stalled machine. Thaw resumes it.
func (n *Node) Freeze() error { return n.signal(syscall.SIGSTOP, true) }

// Thaw resumes a frozen node (SIGCONT).
func (n *Node) Thaw() error { return n.signal(syscall.SIGCONT, false) }

func (n *Node) signal(sig syscall.Signal, frozen bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.isExited() {
		return fmt.Errorf("kafkanode: node %d is not running", n.ID)
	}
	if err := n.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("kafkanode: node %d: %v: %w", n.ID, sig, err)
	}
	n.frozen = frozen
	return nil
}

// exitedCh is the channel closed when the current process exits.
func (n *Node) exitedCh() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exited
}

// LogTail returns the last lines of the node's log (at most max bytes),
// the part that says why a start failed.
func (n *Node) LogTail(max int) string {
	b, err := os.ReadFile(n.LogPath())
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(b))
}

// format writes the node's settings and formats its storage with Kafka's
// storage tool under the cluster id.
func (n *Node) format(ctx context.Context, clusterID string, props map[string]string) error {
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return fmt.Errorf("kafkanode: node %d folder: %w", n.ID, err)
	}
	if err := writeProps(filepath.Join(n.dir, "server.properties"), props); err != nil {
		return err
	}
	if err := n.install.writeLogConfig(n.dir); err != nil {
		return err
	}
	args := append(n.install.jvmArgs("256m", n.dir), "kafka.tools.StorageTool", "format",
		"-t", clusterID, "-c", filepath.Join(n.dir, "server.properties"), "--ignore-formatted")
	out, err := exec.CommandContext(ctx, n.install.Java, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kafkanode: format node %d storage (kafka.tools.StorageTool): %w: %s", n.ID, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// jvmArgs are the java flags of a node or a tool run: the heap, headless,
// the log settings of this release's logging framework, the classpath, then
// PLAYPIPE_KAFKA_JVM_OPTS split on spaces (a diagnosis's flags; none by
// default).
func (in Install) jvmArgs(heap, dir string) []string {
	return append([]string{
		"-Xms128m", "-Xmx" + heap,
		"-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
		"-Djava.awt.headless=true",
		// Kafka 4.x: log4j2; 3.x: reload4j (log4j 1). Each ignores the other's.
		"-Dlog4j2.configurationFile=" + filepath.Join(dir, "log4j2.properties"),
		"-Dlog4j.configuration=file:" + filepath.Join(dir, "log4j.properties"),
		"-cp", filepath.Join(in.Libs, "*"),
	}, strings.Fields(os.Getenv("PLAYPIPE_KAFKA_JVM_OPTS"))...)
}

// writeLogConfig writes both logging frameworks' settings: INFO to stdout
// (the node's log file), the chatty request logger and state change log
// at WARN.
func (in Install) writeLogConfig(dir string) error {
	const log4j2 = `status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.req.name = kafka.request.logger
logger.req.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
`
	const log4j1 = `log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
`
	for name, body := range map[string]string{"log4j2.properties": log4j2, "log4j.properties": log4j1} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("kafkanode: %s: %w", name, err)
		}
	}
	return nil
}

func writeProps(path string, props map[string]string) error {
	var b strings.Builder
	for _, k := range sortedKeys(props) {
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("kafkanode: %w", err)
	}
	return nil
}
