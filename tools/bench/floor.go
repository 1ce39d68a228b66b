//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/testkit/kafkanode"
)

// floorTopic is the topic Kafka's own tools write and read.
const floorTopic = "bench.floor"

// floorRecordSize is the size of the tools' records: about a play's
// records on average (an event ~300 bytes, a report ~400, a Delivery
// record ~250).
const floorRecordSize = 300

// floorResult is what Kafka's own tools measured on the benchmark's node:
// the broker's CPU per record written (ProducerPerformance: acks=all,
// linger 5 ms, Kafka's batching) and read (ConsumerPerformance).
type floorResult struct {
	records            int
	prodRate, consRate float64       // records/s, from the tools' own output
	prodCPU, consCPU   time.Duration // the broker's CPU over each tool's run
	prodJIT, consJIT   time.Duration // of which its JIT compiler threads
	prodLine, consLine string        // the tools' summary lines
}

// perRecord is the broker's CPU in µs per record written and read, with
// and without its JIT compiler threads.
func (f floorResult) perRecord() (prod, cons, prodNoJIT, consNoJIT float64) {
	n := float64(f.records)
	return us(f.prodCPU) / n, us(f.consCPU) / n, us(f.prodCPU-f.prodJIT) / n, us(f.consCPU-f.consJIT) / n
}

// toolsDir is where `make kafka` puts kafka-tools and its dependencies.
func toolsDir(in kafkanode.Install) string {
	return filepath.Join(filepath.Dir(in.Libs), "tools")
}

// runFloor runs Kafka's ProducerPerformance, then ConsumerPerformance, on
// the benchmark's node with -floor-records records of floorRecordSize
// bytes in a topic of -partitions partitions, and measures the broker
// JVM's CPU over each. A first pass of both, on a topic of its own, is not
// measured: the tools' requests are new to the JVM, which compiles their
// paths again (the pipeline's measured round comes after warm-up rounds
// for the same reason), so the floor, like the pipeline, is the broker's
// cost once warm.
func (e *env) runFloor(ctx context.Context) (floorResult, error) {
	in, err := kafkanode.FindInstall(os.Getenv("PLAYPIPE_KAFKA_VERSION"))
	if err != nil {
		return floorResult{}, err
	}
	tools := toolsDir(in)
	if _, err := os.Stat(filepath.Join(tools, "kafka-tools-"+in.Version+".jar")); err != nil {
		return floorResult{}, fmt.Errorf("the perf tools of Apache Kafka are missing in %s: run `make kafka` (deploy/kafka/tools-pom.xml): %w", tools, err)
	}
	if _, err := e.floorPass(ctx, in.Java, tools, floorTopic+".warm"); err != nil {
		return floorResult{}, fmt.Errorf("warm-up pass: %w", err)
	}
	return e.floorPass(ctx, in.Java, tools, floorTopic)
}

// floorPass is one run of both tools (their jars in tools, run by java) on
// a new topic (its group named after it).
func (e *env) floorPass(ctx context.Context, java, tools, topic string) (floorResult, error) {
	f := floorResult{records: e.o.floorRecords}
	if err := e.createFloorTopic(ctx, topic); err != nil {
		return f, err
	}
	n := strconv.Itoa(f.records)
	run := func(class string, args ...string) (string, time.Duration, time.Duration, error) {
		return e.measureTool(ctx, java, append([]string{"-Xmx512m", "-cp", filepath.Join(tools, "*"), class}, args...))
	}
	var out string
	var err error
	out, f.prodCPU, f.prodJIT, err = run("org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
		"--num-records", n, "--record-size", strconv.Itoa(floorRecordSize), "--throughput", "-1",
		"--producer-props", "bootstrap.servers="+e.brokers, "acks=all", "linger.ms=5")
	if err != nil {
		return f, fmt.Errorf("ProducerPerformance: %w", err)
	}
	if f.prodLine, f.prodRate, err = toolRate(out, " records sent, ", " records/sec"); err != nil {
		return f, fmt.Errorf("ProducerPerformance: %w; output:\n%s", err, out)
	}
	out, f.consCPU, f.consJIT, err = run("org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", e.brokers,
		"--topic", topic, "--messages", n, "--timeout", "60000", "--group", strings.ReplaceAll(topic, ".", "-"))
	if err != nil {
		return f, fmt.Errorf("ConsumerPerformance: %w", err)
	}
	if f.consLine, f.consRate, err = consumerRate(out); err != nil {
		return f, fmt.Errorf("ConsumerPerformance: %w; output:\n%s", err, out)
	}
	return f, nil
}

// createFloorTopic makes a tools' topic with the pipeline's partitions.
func (e *env) createFloorTopic(ctx context.Context, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...))
	if err != nil {
		return err
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(cctx, int32(e.o.partitions), -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", topic, err)
	}
	return nil
}

// measureTool runs java with args to its end and returns its output and the
// broker JVM's CPU over the run, and how much of it its JIT compiler
// threads took.
func (e *env) measureTool(ctx context.Context, java string, args []string) (string, time.Duration, time.Duration, error) {
	tctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(tctx, java, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = e.dir
	t0, err := threadCPU(e.brokerPID)
	if err != nil {
		return "", 0, 0, err
	}
	runErr := cmd.Run()
	t1, err := threadCPU(e.brokerPID)
	if err != nil {
		return "", 0, 0, err
	}
	if runErr != nil {
		return out.String(), 0, 0, fmt.Errorf("%w; output:\n%s", runErr, tail(out.String(), 20))
	}
	var all, jit time.Duration
	for k, v := range t1 {
		d := v - t0[k]
		all += d
		if isJIT(k) {
			jit += d
		}
	}
	return out.String(), all, jit, nil
}

// isJIT reports whether a JVM thread group (threadCPU's names) is the JIT
// compiler's: "C1 CompilerThread0", "C2 CompilerThread1", which the kernel
// cuts to 15 characters and threadCPU strips of digits ("C CompilerThre").
func isJIT(group string) bool { return strings.Contains(group, "CompilerThre") }

// toolRate finds ProducerPerformance's summary line (the last with both
// marks) and its records/s: "600000 records sent, 149514.0 records/sec (…)".
func toolRate(out, mark, unit string) (string, float64, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		a := strings.Index(l, mark)
		b := strings.Index(l, unit)
		if a < 0 || b < a {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(l[a+len(mark):b]), 64)
		if err != nil {
			return l, 0, fmt.Errorf("rate in %q: %w", l, err)
		}
		return strings.TrimSpace(l), v, nil
	}
	return "", 0, fmt.Errorf("no line with %q and %q", mark, unit)
}

// consumerRate reads ConsumerPerformance's CSV: a header naming
// fetch.nMsg.sec (the rate once the group was joined), then the values.
func consumerRate(out string) (string, float64, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := 0; i+1 < len(lines); i++ {
		hdr := strings.Split(lines[i], ",")
		col := -1
		for j, h := range hdr {
			if strings.TrimSpace(h) == "fetch.nMsg.sec" {
				col = j
			}
		}
		if col < 0 {
			continue
		}
		vals := strings.Split(lines[i+1], ",")
		if col >= len(vals) {
			break
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(vals[col]), 64)
		if err != nil {
			return lines[i+1], 0, fmt.Errorf("fetch.nMsg.sec in %q: %w", lines[i+1], err)
		}
		return strings.TrimSpace(lines[i+1]), v, nil
	}
	return "", 0, fmt.Errorf("no CSV with fetch.nMsg.sec")
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// floorPerPlay is the floor of a run's broker CPU per play (µs, with and
// without the JIT compiler threads): the records a play writes (its share
// of the publisher's events, what the roles produce) at the tools' CPU per
// record written, plus those it reads at their CPU per record read. It
// also returns those records per play.
func (r result) floorPerPlay() (floor, floorNoJIT float64) {
	floor, floorNoJIT, _, _ = r.floorDetail()
	return floor, floorNoJIT
}

func (r result) floorDetail() (floor, floorNoJIT, written, read float64) {
	f := r.floor
	if f.records == 0 || r.posted == 0 {
		return 0, 0, 0, 0
	}
	plays := float64(r.posted)
	for _, rw := range r.wire {
		written += rw.w.prodRecords
		read += rw.w.fetchRecords
	}
	written = (written + float64(r.events)) / plays
	read /= plays
	prod, cons, prodNo, consNo := f.perRecord()
	return written*prod + read*cons, written*prodNo + read*consNo, written, read
}

// printFloor writes the floor and the run's broker CPU per play against it.
func printFloor(w io.Writer, r result) {
	f := r.floor
	if f.records == 0 {
		return
	}
	floor, floorNo, written, read := r.floorDetail()
	prod, cons, prodNo, consNo := f.perRecord()
	broker, brokerNo := r.brokerCPU()
	fmt.Fprintf(w, "\nThe floor: Kafka's own tools on the same node after the run (%d records of %d bytes, %d partitions):\n\n", f.records, floorRecordSize, r.partitions)
	fmt.Fprintf(w, "| measure | all broker threads | without the JIT compiler's |\n|---|---:|---:|\n")
	fmt.Fprintf(w, "| ProducerPerformance (acks=all, linger.ms=5): %.0f records/s; broker CPU µs per record written | %.1f | %.1f |\n", f.prodRate, prod, prodNo)
	fmt.Fprintf(w, "| ConsumerPerformance: %.0f records/s once in its group; broker CPU µs per record read (its 3 s group join included) | %.1f | %.1f |\n", f.consRate, cons, consNo)
	fmt.Fprintf(w, "| floor per play: %.2f records written, %.2f read (the roles' metrics, and the publisher's events) | %.1f µs | %.1f µs |\n", written, read, floor, floorNo)
	fmt.Fprintf(w, "| the pipeline's broker CPU per play | %.1f µs | %.1f µs |\n", broker, brokerNo)
	fmt.Fprintf(w, "| pipeline / floor | %.2f× | %.2f× |\n", broker/floor, brokerNo/floorNo)
	fmt.Fprintf(w, "\n- %s\n- %s\n", f.prodLine, f.consLine)
}
