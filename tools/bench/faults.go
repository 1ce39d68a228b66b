//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// sandboxFaults are the faults a round sets in the sandbox: every report
// answered after latency, the share rate500 of them answered 500 (a seeded
// draw, so the plain client and the reporter meet the same sequence of
// answers), and with poison every report of poisonTrack answered 500 —
// after hold, when set (a partner hanging on that track); with holdRate,
// that share of all posts (any track, its own seeded draw) held hold, then
// answered 500.
type sandboxFaults struct {
	latency  time.Duration
	rate500  float64
	seed     uint64
	poison   bool
	hold     time.Duration
	holdRate float64
}

// setFaults replaces the sandbox's faults with sf (PUT /admin/faults); the
// zero sf sets none.
func setFaults(ctx context.Context, admin string, sf sandboxFaults) error {
	type report struct {
		Latency     string  `json:"latency"`
		Rate500     float64 `json:"rate_500"`
		TrackIDs    []int64 `json:"track_ids,omitempty"`
		TrackStatus int     `json:"track_status,omitempty"`
		Hold        string  `json:"hold,omitempty"`
		HoldRate    float64 `json:"hold_rate,omitempty"`
	}
	r := report{Latency: sf.latency.String(), Rate500: sf.rate500}
	if sf.holdRate > 0 && sf.hold > 0 {
		r.HoldRate, r.Hold = sf.holdRate, sf.hold.String()
	}
	if sf.poison {
		r.TrackIDs, r.TrackStatus = []int64{poisonTrack}, http.StatusInternalServerError
		if sf.hold > 0 {
			r.Hold = sf.hold.String()
		}
	}
	body, err := json.Marshal(struct {
		Seed   uint64 `json:"seed"`
		Report report `json:"report"`
	}{sf.seed, r})
	if err != nil {
		return fmt.Errorf("sandbox faults: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+admin+"/admin/faults", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("sandbox faults: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("sandbox faults: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("sandbox faults: %s: %s", resp.Status, b)
	}
	return nil
}

// injectedCount is the number of reports the sandbox answered with an
// injected fault since its last reset (its ledger's injected_count).
func injectedCount(ctx context.Context, admin string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/admin/ledger?since=9223372036854775807", nil)
	if err != nil {
		return 0, fmt.Errorf("sandbox ledger: %w", err)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("sandbox ledger: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("sandbox ledger: %s", resp.Status)
	}
	var l struct {
		Injected *int64 `json:"injected_count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return 0, fmt.Errorf("sandbox ledger: %w", err)
	}
	if l.Injected == nil {
		return 0, fmt.Errorf("sandbox ledger: no injected_count (a sandbox without injected-fault counts: rebuild bin/playpipe)")
	}
	return *l.Injected, nil
}

// parseErrorRates parses -error-rates ("0,0.001,0.01,0.02"): shares of
// posts answered 500, each 0–0.5.
func parseErrorRates(s string) ([]float64, error) {
	var rs []float64
	for f := range strings.SplitSeq(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r < 0 || r > 0.5 {
			return nil, fmt.Errorf("-error-rates: %q is not a share of 0–0.5", f)
		}
		rs = append(rs, r)
	}
	return rs, nil
}
