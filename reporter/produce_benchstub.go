//go:build benchstub

package reporter

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A measurement build, never a product: `go build -tags benchstub` makes a
// reporter that writes NO Delivery record and NO lease marker. Each record
// is "acknowledged" at once, in the caller's goroutine (every caller of
// produce holds no lock), with the next offset of its deliveries partition.
// Nothing survives the process and the ledger sees nothing: it bounds from
// above what any saving in the reporter's Kafka writes can give in
// bench-report (the broker's and franz-go's work per record, the
// acknowledgement's wait). docs/reporter.md, "The 0 ms bound".

// stub numbers the records per deliveries partition (a measurement
// process runs one reporter).
var stub struct {
	once sync.Once
	mu   sync.Mutex
	next map[int32]int64
}

func (rn *run) produce(rec *kgo.Record, cb func(*kgo.Record, error)) {
	s := &stub
	s.once.Do(func() {
		s.next = map[int32]int64{}
		rn.log.Warn("benchstub build: Delivery records and lease markers are not written to Kafka (measurement only)")
	})
	s.mu.Lock()
	rec.Offset = s.next[rec.Partition]
	s.next[rec.Partition]++
	s.mu.Unlock()
	cb(rec, nil)
}
