//go:build linux

package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestCountByAPI: the broker profile's samples of the request threads are
// counted by the outermost KafkaApis.handle… frame; the network threads'
// and the other threads' samples apart or not at all.
func TestCountByAPI(t *testing.T) {
	frame := func(typ, name string) string {
		return fmt.Sprintf(`{"method":{"type":{"name":%q},"name":%q}}`, typ, name)
	}
	sample := func(thread string, frames ...string) string {
		return fmt.Sprintf(`{"type":"jdk.ExecutionSample","values":{"sampledThread":{"javaName":%q},"stackTrace":{"frames":[%s]}}}`,
			thread, strings.Join(frames, ","))
	}
	const h = "data-plane-kafka-request-handler-0"
	produce := []string{frame("org/apache/kafka/storage/internals/log/UnifiedLog", "append"), frame("kafka/server/KafkaApis", "handleProduceRequest"),
		frame("kafka/server/KafkaApis", "handle"), frame("kafka/server/KafkaRequestHandler", "run")}
	fetch := []string{frame("kafka.server.ReplicaManager", "readFromLog"), frame("kafka.server.KafkaApis", "handleFetchRequest"),
		frame("kafka.server.KafkaApis", "handle")}
	events := []string{
		sample(h, produce...), sample(h, produce...), sample(h, fetch...),
		sample(h, frame("java.lang.Thread", "run")),
		sample("data-plane-kafka-network-thread-1-ListenerName(PLAINTEXT)-PLAINTEXT-0", frame("sun.nio.ch.EPoll", "wait")),
		sample("C2 CompilerThread0", produce...),
	}
	out := `{"recording":{"events":[` + strings.Join(events, ",") + `]}}`
	shares, total, err := countByAPI([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if total != 5 {
		t.Errorf("total %d, want 5 (the compiler thread's sample not counted)", total)
	}
	var got []string
	for _, s := range shares {
		got = append(got, fmt.Sprintf("%s %d %v", s.name, s.samples, s.leaves))
	}
	want := []string{"handleProduceRequest 2 [UnifiedLog.append]", "handleFetchRequest 1 [ReplicaManager.readFromLog]",
		"network threads 1 [EPoll.wait]", "request handlers, other 1 [Thread.run]"}
	if !slices.Equal(got, want) {
		t.Errorf("by API:\n got %q\nwant %q", got, want)
	}
	if _, _, err := countByAPI([]byte("not json")); err == nil {
		t.Error("no error for output that is not JSON")
	}
}
