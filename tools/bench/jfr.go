//go:build linux

package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/playpipe/playpipe/testkit/kafkanode"
)

// The broker's profile (-broker-profile, Apache Kafka only): a Java Flight
// Recorder recording of the broker JVM over the measured round, its
// request threads' samples ("data-plane-kafka-…": the network threads and
// the request handlers) counted by the Kafka API being handled, the
// KafkaApis.handle… frame of each stack, so that the broker's CPU per play
// reads per kind of request and so per role.

// roundProfile is -broker-profile's recordings in one run: one over the
// warm-up, discarded (starting the recorder deoptimizes and recompiles the
// broker's hot code: its JIT compiler threads took 67 µs per play over a
// round recorded from a cold recorder), then one over the measured round,
// on a settled JVM. A nil *roundProfile records nothing.
type roundProfile struct {
	e         *env
	warm, jfr *brokerJFR
}

// profileResult is what a round's recording gave.
type profileResult struct {
	apis    []apiShare // the request threads' samples by Kafka API
	samples int        // the request threads' samples
	file    string
}

// startProfile starts the warm-up's recording (Apache Kafka with
// -broker-profile; otherwise nil).
func (e *env) startProfile(ctx context.Context) (*roundProfile, error) {
	if e.o.kafka != kafkaApache || e.o.brokerProfile == "" {
		return nil, nil
	}
	warm, err := e.startJFR(ctx, "playpipe-bench-warm-up", "")
	if err != nil {
		return nil, err
	}
	return &roundProfile{e: e, warm: warm}, nil
}

// startRound ends the warm-up's recording and starts the round's, before
// the round's CPU readings (JFR.start costs the broker CPU).
func (p *roundProfile) startRound(ctx context.Context, started time.Time) error {
	if p == nil {
		return nil
	}
	if err := p.warm.discard(ctx); err != nil {
		return err
	}
	var err error
	p.jfr, err = p.e.startJFR(ctx, "playpipe-bench", profileFile(p.e.o.brokerProfile, started))
	return err
}

// finish writes the round's recording (after the round's CPU readings: the
// dump costs the broker CPU) and counts its samples by Kafka API.
func (p *roundProfile) finish(ctx context.Context) (profileResult, error) {
	if p == nil {
		return profileResult{}, nil
	}
	if err := p.jfr.stop(ctx); err != nil {
		return profileResult{}, err
	}
	apis, n, err := p.jfr.byAPI(ctx)
	return profileResult{apis: apis, samples: n, file: p.jfr.file}, err
}

// brokerJFR is one recording of the broker JVM pid, by the JDK's jcmd.
type brokerJFR struct {
	jcmd, jfr string // the JDK's tools, next to its java
	pid       int
	name      string // the recording's, in the JVM
	file      string
}

// startJFR starts a recording of the broker JVM with the JDK's "profile"
// settings, a Java stack sample every 1 ms (jfrSettings).
func (e *env) startJFR(ctx context.Context, name, file string) (*brokerJFR, error) {
	in, err := kafkanode.FindInstall(os.Getenv("PLAYPIPE_KAFKA_VERSION"))
	if err != nil {
		return nil, err
	}
	java, err := filepath.EvalSymlinks(in.Java)
	if err != nil {
		return nil, fmt.Errorf("broker profile: %w", err)
	}
	dir := filepath.Dir(java)
	j := &brokerJFR{jcmd: filepath.Join(dir, "jcmd"), jfr: filepath.Join(dir, "jfr"), pid: e.brokerPID, name: name, file: file}
	settings, err := e.jfrSettings(filepath.Join(filepath.Dir(dir), "lib", "jfr", "profile.jfc"))
	if err != nil {
		return nil, err
	}
	// Whole stacks (the default 64 frames cut off the KafkaApis frame of a
	// deep one); refused once a recording ran in this JVM, whose depth
	// then stays.
	_ = j.cmd(ctx, "JFR.configure", "stackdepth=1024")
	if err := j.cmd(ctx, "JFR.start", "name="+name, "settings="+settings); err != nil {
		return nil, fmt.Errorf("broker profile: %w", err)
	}
	return j, nil
}

// jfrSettings writes the JDK's "profile" settings (profile, the JDK's
// profile.jfc) with a Java stack sample every 1 ms instead of 10 into the
// run's folder: at 10 ms a 10 s round gave ~40 samples of the request
// threads.
func (e *env) jfrSettings(profile string) (string, error) {
	b, err := os.ReadFile(profile)
	if err != nil {
		return "", fmt.Errorf("broker profile: %w", err)
	}
	const from = `control="method-sampling-java-interval">10 ms<`
	if !bytes.Contains(b, []byte(from)) {
		return "", fmt.Errorf("broker profile: %s has no 10 ms Java sampling interval to shorten", profile)
	}
	b = bytes.Replace(b, []byte(from), []byte(`control="method-sampling-java-interval">1 ms<`), 1)
	out := filepath.Join(e.dir, "broker-profile.jfc")
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return "", fmt.Errorf("broker profile: %w", err)
	}
	return out, nil
}

// stop writes the recording to its file and ends it.
func (j *brokerJFR) stop(ctx context.Context) error {
	if err := j.cmd(ctx, "JFR.dump", "name="+j.name, "filename="+j.file); err != nil {
		return fmt.Errorf("broker profile: %w", err)
	}
	return j.discard(ctx)
}

// discard ends the recording without writing it.
func (j *brokerJFR) discard(ctx context.Context) error {
	if err := j.cmd(ctx, "JFR.stop", "name="+j.name); err != nil {
		return fmt.Errorf("broker profile: %w", err)
	}
	return nil
}

func (j *brokerJFR) cmd(ctx context.Context, args ...string) error {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(cctx, j.jcmd, append([]string{fmt.Sprint(j.pid)}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("jcmd %d %s: %w: %s", j.pid, args[0], err, tail(string(out), 5))
	}
	return nil
}

// apiShare is the request threads' samples of one kind of work.
type apiShare struct {
	name    string
	samples int
	leaves  []string // the most sampled innermost methods, most first
}

// jfrRecording is the part of `jfr print --json` read here.
type jfrRecording struct {
	Recording struct {
		Events []struct {
			Values struct {
				SampledThread struct {
					JavaName string `json:"javaName"`
					OSName   string `json:"osName"`
				} `json:"sampledThread"`
				StackTrace *struct {
					Frames []struct {
						Method struct {
							Type struct {
								Name string `json:"name"`
							} `json:"type"`
							Name string `json:"name"`
						} `json:"method"`
					} `json:"frames"`
				} `json:"stackTrace"`
			} `json:"values"`
		} `json:"events"`
	} `json:"recording"`
}

// byAPI reads the recording's execution samples and counts those of the
// request threads by the KafkaApis.handle… method on their stack (the
// outermost one); samples without one are the network threads' or the
// handlers' other work (countByAPI).
func (j *brokerJFR) byAPI(ctx context.Context) ([]apiShare, int, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(cctx, j.jfr, "print", "--json", "--stack-depth", "1024", "--events", "jdk.ExecutionSample", j.file).Output()
	if err != nil {
		return nil, 0, fmt.Errorf("broker profile: jfr print %s: %w", j.file, err)
	}
	shares, total, err := countByAPI(out)
	if err != nil {
		return nil, 0, fmt.Errorf("broker profile: jfr print %s: %w", j.file, err)
	}
	return shares, total, nil
}

// countByAPI counts the request threads' samples of `jfr print --json`
// output by the KafkaApis.handle… method on their stack.
func countByAPI(out []byte) ([]apiShare, int, error) {
	var rec jfrRecording
	if err := json.Unmarshal(out, &rec); err != nil {
		return nil, 0, err
	}
	counts := map[string]int{}
	leaves := map[string]map[string]int{}
	total := 0
	for _, e := range rec.Recording.Events {
		v := e.Values
		th := cmp.Or(v.SampledThread.JavaName, v.SampledThread.OSName)
		if !strings.HasPrefix(th, "data-plane") {
			continue
		}
		total++
		api := "network threads"
		if !strings.Contains(th, "network") {
			api = "request handlers, other"
		}
		leaf := ""
		if st := v.StackTrace; st != nil && len(st.Frames) > 0 {
			f := st.Frames[0].Method
			leaf = shortType(f.Type.Name) + "." + f.Name
			for i := len(st.Frames) - 1; i >= 0; i-- {
				m := st.Frames[i].Method
				if shortType(m.Type.Name) == "KafkaApis" && strings.HasPrefix(m.Name, "handle") && m.Name != "handle" {
					api = m.Name
					break
				}
			}
		}
		counts[api]++
		if leaves[api] == nil {
			leaves[api] = map[string]int{}
		}
		leaves[api][leaf]++
	}
	var shares []apiShare
	for api, n := range counts {
		shares = append(shares, apiShare{name: api, samples: n, leaves: topKeys(leaves[api], 3)})
	}
	slices.SortFunc(shares, func(a, b apiShare) int { return cmp.Or(b.samples-a.samples, strings.Compare(a.name, b.name)) })
	return shares, total, nil
}

// shortType is a class name without its package (`jfr print` separates
// them with '/', as the JVM does).
func shortType(t string) string { return t[strings.LastIndexAny(t, "./")+1:] }

// topKeys are m's n most counted keys, most first.
func topKeys(m map[string]int, n int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(m[b]-m[a], strings.Compare(a, b)) })
	return keys[:min(n, len(keys))]
}

// printBrokerProfile writes the request threads' CPU per play by Kafka API:
// their samples' shares of the request threads' CPU over the round.
func printBrokerProfile(w io.Writer, r result, plays float64) {
	if len(r.prof.apis) == 0 || r.prof.samples == 0 {
		return
	}
	var dataPlane time.Duration
	for k, v := range r.brokerThreads1 {
		if strings.HasPrefix(k, "data-plane") {
			dataPlane += v - r.brokerThreads0[k]
		}
	}
	fmt.Fprintf(w, "\nThe broker's request threads (data-plane-kafka-…: %.1f µs per play) by Kafka API, %d stack samples (-broker-profile: JFR, %s):\n\n",
		us(dataPlane)/plays, r.prof.samples, r.prof.file)
	fmt.Fprintf(w, "| work | share of samples | µs per play | most sampled methods |\n|---|---:|---:|---|\n")
	for _, s := range r.prof.apis {
		share := float64(s.samples) / float64(r.prof.samples)
		fmt.Fprintf(w, "| %s | %.1f %% | %.1f | %s |\n", s.name, 100*share, share*us(dataPlane)/plays, strings.Join(s.leaves, ", "))
	}
}

// profileFile is the round's recording file: -broker-profile's name with
// the round's start time, so that the rounds of one run keep theirs.
func profileFile(base string, started time.Time) string {
	return fmt.Sprintf("%s.%s.jfr", strings.TrimSuffix(base, ".jfr"), started.Format("150405"))
}
