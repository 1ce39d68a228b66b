package reporter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// TestDeliveryRecordRoom: the Delivery record's key, source header and
// value are right whether they fit the room allocated with the record
// (deliveryAlloc) or not (a long report id, a long message).
func TestDeliveryRecordRoom(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	rn := &run{Reporter: &Reporter{cfg: Config{PartnerURL: "http://partner.example", Now: func() time.Time { return at }}}}
	type tcase struct{ name, id, msg string }
	cases := []tcase{
		{"fits", strings.Repeat("a", 32), "ok"},
		{"long message", strings.Repeat("c", 32), strings.Repeat("m", 1000)},
	}
	// Report ids of every length around the room and append's growth steps
	// (an id is whatever a record on the reports topic carries).
	for n := 1; n <= 1100; n++ {
		cases = append(cases, tcase{fmt.Sprintf("id of %d bytes", n), strings.Repeat("b", n), "ok"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := &job{id: tc.id, evID: "ev-1", attempt: 2, ps: &partState{logPart: 4}, rec: &kgo.Record{Partition: 3, Offset: 42},
				dec: delivery.Decision{Action: delivery.ActDelivered, Outcome: schemas.OutcomeDelivered, Status: 200, Message: tc.msg}}
			r := rn.deliveryRecord(context.Background(), j)
			if string(r.Key) != tc.id {
				t.Errorf("key %q, want %q", r.Key, tc.id)
			}
			if r.Partition != 4 {
				t.Errorf("partition %d, want 4", r.Partition)
			}
			if len(r.Headers) != 1 || r.Headers[0].Key != schemas.HeaderSource || string(r.Headers[0].Value) != "3:42:f" {
				t.Errorf("headers %+v, want %s=3:42:f", r.Headers, schemas.HeaderSource)
			}
			var d schemas.Delivery
			if err := schemas.DecodeDelivery(r.Value, &d); err != nil {
				t.Fatalf("decode %q: %v", r.Value, err)
			}
			if d.ReportID != tc.id || d.EventID != "ev-1" || d.Attempt != 2 || d.Message != tc.msg || d.At != at.UnixMilli() || d.Partner != "http://partner.example" {
				t.Errorf("delivery %+v", d)
			}
			// The key and header must not share bytes the value later overwrote.
			if string(r.Key) != tc.id || string(r.Headers[0].Value) != "3:42:f" {
				t.Errorf("key or header overwritten: %q %q", r.Key, r.Headers[0].Value)
			}
		})
	}
}
