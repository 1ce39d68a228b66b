package analytics

import (
	"bytes"
	"encoding/csv"
	"strings"
	"testing"
	"time"
)

// TestWriteAuditReplayRows: under a replay, each row of the table names
// the figure it holds (the replay id once, on the plays row), and the CSV
// names the replay on every row with the figure as its metric.
func TestWriteAuditReplayRows(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	r := &Audit{From: at, To: at.Add(time.Hour), PendingThreshold: "10m0s",
		Replays: []ReplayCount{{ID: "rp-7", Reason: "partner lost a day", Plays: 41, Delivered: 37, Rejected: 3, DeliveredTwice: 2, First: at, Last: at}}}
	var tbl bytes.Buffer
	if err := WriteAudit(&tbl, r, FormatTable); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"rp-7 (partner lost a day): plays re-sent": "41",
		"delivered":           "37",
		"rejected by the API": "3",
		"delivered more than once by this replay": "2",
	}
	section, seen := "", 0
	for _, ln := range strings.Split(tbl.String(), "\n") {
		if strings.TrimSpace(ln) == "REPLAYS" {
			section = "REPLAYS"
			continue
		}
		if section != "REPLAYS" || !strings.HasPrefix(ln, "  ") {
			section = ""
			continue
		}
		f := strings.Split(strings.TrimSpace(ln), "  ")
		label, n := strings.TrimSpace(f[0]), ""
		for _, x := range f[1:] {
			if x = strings.TrimSpace(x); x != "" {
				n = x
				break
			}
		}
		if want[label] != n {
			t.Errorf("replay row %q: label %q, figure %q; want one of %v", ln, label, n, want)
		}
		if strings.Contains(label, "rp-7") && label != "rp-7 (partner lost a day): plays re-sent" {
			t.Errorf("replay row %q names the replay id where a figure's name belongs", ln)
		}
		seen++
	}
	if seen != len(want) {
		t.Errorf("%d replay rows, want %d:\n%s", seen, len(want), tbl.String())
	}

	var c bytes.Buffer
	if err := WriteAudit(&c, r, FormatCSV); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&c).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, rec := range recs {
		if rec[0] == "replays" {
			if rec[2] != "rp-7 (partner lost a day)" {
				t.Errorf("CSV replay row %v: key %q", rec, rec[2])
			}
			got[rec[1]] = rec[3]
		}
	}
	wantCSV := map[string]string{"plays re-sent by replay": "41", "delivered by replay": "37", "rejected by the API during replay": "3", "delivered more than once by the same replay": "2"}
	if len(got) != len(wantCSV) {
		t.Errorf("CSV replay rows %v, want %v", got, wantCSV)
	}
	for k, v := range wantCSV {
		if got[k] != v {
			t.Errorf("CSV replay row %q = %q, want %q", k, got[k], v)
		}
	}
}
