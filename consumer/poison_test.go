package consumer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// setMaxMessageBytes sets max.message.bytes of topic on the test broker.
func setMaxMessageBytes(t *testing.T, k *testenv.Kafka, topic string, n int) {
	t.Helper()
	adm := kadm.NewClient(k.Client(t))
	v := strconv.Itoa(n)
	rs, err := adm.AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, topic)
	if err == nil {
		_, err = rs.On(topic, nil)
	}
	if err != nil {
		t.Fatalf("max.message.bytes of %s: %v", topic, err)
	}
}

// publishRaw writes records with a client allowed to send large ones.
func publishRaw(t *testing.T, k *testenv.Kafka, recs ...*kgo.Record) {
	t.Helper()
	cl := k.Client(t, kgo.ProducerBatchMaxBytes(16<<20), kgo.ProducerLinger(0))
	for _, r := range recs {
		if r.Timestamp.IsZero() {
			r.Timestamp = testArrival(r.Value)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// readRejections reads the committed rejections, by record key.
func readRejections(t *testing.T, k *testenv.Kafka) (map[string]schemas.Rejection, map[string]int) {
	t.Helper()
	out, sizes := map[string]schemas.Rejection{}, map[string]int{}
	for _, r := range k.ReadAll(t, k.Config.Topics().Rejected) {
		var rj schemas.Rejection
		if err := json.Unmarshal(r.Value, &rj); err != nil {
			t.Fatalf("rejection not JSON: %v", err)
		}
		out[string(r.Key)] = rj
		sizes[string(r.Key)] = len(r.Value)
	}
	return out, sizes
}

// TestPoisonEventsDoNotStall: poison events do not stall the consumer: a
// 200 KB event (valid JSON, unknown mix, a pad of 200k '<', which JSON
// escaping grows sixfold) and a 5 MiB one are rejected as too_large with
// records that fit, and 300 ordinary events published after them on the
// same partition are all enriched, with no manual step (kfake over TCP, the
// sandbox through the real partner API client).
func TestPoisonEventsDoNotStall(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 1) // one partition: the poison sits in front of everything
	sb := testenv.StartSandbox(t)
	topics := k.Config.Topics()
	setMaxMessageBytes(t, k, topics.Events, 8<<20) // the gateway may be bypassed: any Kafka client can publish

	refs, unknown := sandboxRefs(sb.Catalog())
	pad := strings.Repeat("<", 200_000)
	poison200k := []byte(`{"event_id":"poison-200k","mix_id":` + strconv.FormatInt(unknown, 10) +
		`,"started_at":1700000000000,"offset_ms":0,"duration_ms":1000,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1,"pad":"` + pad + `"}`)
	poison5m := append([]byte(`{"event_id":"poison-5m","pad":"`), bytes.Repeat([]byte("x"), 5<<20)...)
	poison5m = append(poison5m, `"}`...)
	publishRaw(t, k,
		&kgo.Record{Topic: topics.Events, Key: []byte("poison-200k"), Value: poison200k},
		&kgo.Record{Topic: topics.Events, Key: []byte("poison-5m"), Value: poison5m})
	var ordinary []genEvent
	for _, g := range genEvents(11, 500, refs, unknown) {
		if g.wantReason == "" && len(ordinary) < 300 {
			ordinary = append(ordinary, g)
		}
	}
	if len(ordinary) != 300 {
		t.Fatalf("%d ordinary events generated, want 300", len(ordinary))
	}
	publish(t, k, topics.Events, ordinary)

	e := newTestEnricher(t, k, sandboxClient(t, sb), nil)
	stop := runEnricher(t, e)
	waitFor(t, 60*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(ordinary)+2) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkOutput(t, k, append(ordinary, // checkOutput: every ordinary event's plays, once; rejections exactly these
		genEvent{key: []byte("poison-200k"), eventID: "poison-200k", wantReason: schemas.ReasonTooLarge},
		genEvent{key: []byte("poison-5m"), eventID: "poison-5m", wantReason: schemas.ReasonTooLarge}))
	rejs, sizes := readRejections(t, k)
	for key, raw := range map[string][]byte{"poison-200k": poison200k, "poison-5m": poison5m} {
		rj := rejs[key]
		sum := sha256.Sum256(raw)
		if rj.RawLen != len(raw) || rj.RawSHA256 != hex.EncodeToString(sum[:]) || !rj.RawTruncated || !strings.HasPrefix(string(raw), rj.Raw) {
			t.Errorf("%s: raw_len %d raw_sha256 %s truncated %v (want %d, %x, true, a prefix)", key, rj.RawLen, rj.RawSHA256, rj.RawTruncated, len(raw), sum)
		}
		if sizes[key] > schemas.MaxRejectionRaw+2048 {
			t.Errorf("%s: rejection record is %d bytes", key, sizes[key])
		}
		t.Logf("%s: event %d bytes → rejection record %d bytes (%s)", key, len(raw), sizes[key], rj.Violations[0].Detail)
	}
}

// TestRefusedRecordIsRejected: Kafka refuses a track play of one event
// (the reports topic's max.message.bytes is smaller than the play, as on a
// cluster configured tighter than the consumer assumes). The transaction
// fails, the event is retried in batches of its own MaxProduceAttempts
// times, then rejected as produce_failed; every other event, before and
// after it on the same partition, is enriched exactly once.
func TestRefusedRecordIsRejected(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 1)
	sb := testenv.StartSandbox(t)
	topics := k.Config.Topics()
	setMaxMessageBytes(t, k, topics.Reports, 6000)

	refs, unknown := sandboxRefs(sb.Catalog())
	var evs []genEvent
	for _, g := range genEvents(12, 240, refs, unknown) {
		if g.wantReason == "" {
			evs = append(evs, g)
		}
	}
	m := refs[0]
	// The os field is random letters: Kafka measures max.message.bytes on
	// the compressed batch, and a repeated letter compresses so well that a
	// batch of only this event's plays can fit under the limit, depending on
	// how the producer splits them into batches.
	rnd := rand.New(rand.NewPCG(1, 2))
	os := make([]byte, 8000)
	for i := range os {
		os[i] = byte('a' + rnd.IntN(26))
	}
	fat := map[string]any{"event_id": "fat-os", "mix_id": m.id, "started_at": int64(1_700_000_000_000), "offset_ms": int64(0),
		"duration_ms": m.lengthMS, "user_id": "u", "country": "DE", "os": string(os), "device": "d", "vendor": int64(1)}
	fb, _ := json.Marshal(fat)
	half := len(evs) / 2
	all := append(append(append([]genEvent{}, evs[:half]...),
		genEvent{key: []byte("fat-os"), value: fb, eventID: "fat-os", wantReason: schemas.ReasonProduceFailed}), evs[half:]...)
	publish(t, k, topics.Events, all)

	e := newTestEnricher(t, k, sandboxClient(t, sb), func(o *Config) { o.MaxProduceAttempts = 2 })
	stop := runEnricher(t, e)
	waitFor(t, 60*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(all)) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := e.Stats()
	t.Logf("stats %+v", st)
	if st.Aborts < 2 {
		t.Errorf("%d aborted transactions: the refused produce should have failed at least twice", st.Aborts)
	}
	checkOutput(t, k, all)
	rejs, _ := readRejections(t, k)
	if rj := rejs["fat-os"]; len(rj.Violations) == 0 || !strings.Contains(rj.Violations[0].Detail, "MESSAGE_TOO_LARGE") || rj.RawLen != len(fb) {
		t.Errorf("produce_failed rejection: %+v", rj.Violations)
	}
}

// TestStrictKeysAndBadMixEndToEnd publishes events with a duplicate key,
// case-folded keys, and events of a mix the partner API answers 400 for
// (through a proxy in front of the sandbox): each is rejected with its
// reason, the 400 mix after the bounded policy, and nothing stalls.
func TestStrictKeysAndBadMixEndToEnd(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 2)
	sb := testenv.StartSandbox(t)
	topics := k.Config.Topics()
	refs, unknown := sandboxRefs(sb.Catalog())
	bad := refs[1].id
	target, _ := url.Parse(sb.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mix400 int
	front := testenv.ServeHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/partners/mix/"+strconv.FormatInt(bad, 10) {
			mix400++
			// The API's own error envelope (an edge's page would be transient).
			http.Error(w, `{"error":true,"reason":"invalid parameter","mix":null}`, http.StatusBadRequest)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	sbFront := *sb
	sbFront.URL = front

	m := refs[0]
	base := fmt.Sprintf(`"mix_id":%d,"started_at":1700000000000,"offset_ms":0,"duration_ms":60000,"user_id":"u","os":"o","device":"d","vendor":1`, m.id)
	var evs []genEvent
	add := func(id, value, reason string) {
		evs = append(evs, genEvent{key: []byte(id), value: []byte(value), eventID: id, wantReason: reason})
	}
	add("dup", `{"event_id":"dup",`+base+`,"country":"DE","event_id":"other"}`, schemas.ReasonDuplicateKey)
	add("upper", `{"EVENT_ID":"upper",`+base+`,"country":"DE"}`, schemas.ReasonKeyCase)
	add("folded", `{"event_id":"folded",`+base+`,"Country":"DE"}`, schemas.ReasonKeyCase)
	for i := 0; i < 3; i++ {
		id := "bad-mix-" + strconv.Itoa(i)
		add(id, fmt.Sprintf(`{"event_id":%q,"mix_id":%d,"started_at":1700000000000,"offset_ms":0,"duration_ms":60000,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`, id, bad), schemas.ReasonMixUnavailable)
	}
	var ordinary []genEvent
	for _, g := range genEvents(13, 200, refs, unknown) {
		if g.wantReason == "" && g.mix.id != bad {
			ordinary = append(ordinary, g)
		}
	}
	all := append(evs, ordinary...)
	publish(t, k, topics.Events, all)

	e := newTestEnricher(t, k, sandboxClient(t, &sbFront), func(o *Config) {
		o.CacheConfig.UnavailableAttempts, o.CacheConfig.UnavailableAfter = 3, 200*time.Millisecond
	})
	stop := runEnricher(t, e)
	waitFor(t, 60*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(all)) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkOutput(t, k, all)
	rejs, _ := readRejections(t, k)
	if rj := rejs["upper"]; rj.Violations[0].Field != "EVENT_ID" || rj.EventID != "" {
		t.Errorf("case-folded key: %+v (event_id %q)", rj.Violations, rj.EventID)
	}
	if rj := rejs["bad-mix-0"]; rj.Raw == "" || !strings.Contains(rj.Violations[0].Detail, "400") {
		t.Errorf("mix_unavailable rejection: %+v", rj)
	}
	if mix400 < 3 {
		t.Errorf("the 400 mix was asked %d times, policy says at least 3", mix400)
	}
}
