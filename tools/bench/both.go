//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// runBoth is -mode e2e -kafka both: rounds of (kfake, Apache Kafka), each
// run printed as it ends, then the two brokers side by side: plays/s, the
// Apache Kafka run's rate against the kfake run's of its round, and the
// broker's CPU per play against the floor Kafka's own tools measured on the
// same node.
func runBoth(ctx context.Context, o options, log *slog.Logger, w io.Writer) error {
	rounds := 1
	if o.roundsSet {
		rounds = o.rounds
	}
	var runs [][2]result
	for i := range rounds {
		var pair [2]result
		for k, broker := range []string{kafkaKfake, kafkaApache} {
			ob := o
			ob.kafka = broker
			log.Info("e2e run", "round", i+1, "broker", broker)
			res, err := runBench(ctx, ob, log)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", i+1, broker, err)
			}
			res.print(w, ob)
			pair[k] = res
		}
		runs = append(runs, pair)
	}
	printBoth(w, runs)
	return nil
}

// brokerCPU is the broker's CPU per play of a run, and the same without
// the JVM's JIT compiler threads (kfake: the same).
func (r result) brokerCPU() (all, noJIT float64) {
	plays := float64(r.posted)
	var cpu, jit time.Duration
	for _, p := range r.procs {
		if p.broker {
			cpu = p.cpu
		}
	}
	for k, v := range r.brokerThreads1 {
		if isJIT(k) {
			jit += v - r.brokerThreads0[k]
		}
	}
	return us(cpu) / plays, us(cpu-jit) / plays
}

// rate is the run's plays/s end to end.
func (r result) rate() float64 { return float64(r.posted) / r.elapsed.Seconds() }

// printBoth writes the comparison of -kafka both.
func printBoth(w io.Writer, runs [][2]result) {
	fmt.Fprintf(w, "\nkfake against Apache Kafka, interleaved (each round: kfake, then Apache Kafka, then its floor):\n\n")
	fmt.Fprintf(w, "| round | kfake plays/s | Apache Kafka plays/s | Apache / kfake | broker CPU µs/play kfake | Apache Kafka (without JIT) | floor µs/play (without JIT) | Apache Kafka / floor (without JIT) |\n")
	fmt.Fprintf(w, "|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, p := range runs {
		k, a := p[0], p[1]
		kb, _ := k.brokerCPU()
		ab, abNo := a.brokerCPU()
		floor, floorNo := a.floorPerPlay()
		ratio := func(x, y float64) string {
			if y == 0 {
				return "–"
			}
			return fmt.Sprintf("%.2f×", x/y)
		}
		fmt.Fprintf(w, "| %d | %.0f | %.0f | %.1f %% | %.1f | %.1f (%.1f) | %.1f (%.1f) | %s (%s) |\n", i+1,
			k.rate(), a.rate(), 100*a.rate()/k.rate(), kb, ab, abNo, floor, floorNo, ratio(ab, floor), ratio(abNo, floorNo))
	}
}
