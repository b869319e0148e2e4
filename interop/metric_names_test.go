package interop

// Every metric name derper exports, checked against ferry in the same run:
// each exists in ferry too, or is listed below as deliberately absent with
// the reason. A dashboard built for derper then finds everything it can
// mean for ferry.

import (
	"sort"
	"strings"
	"testing"
)

// absentInFerry are derper's names ferry does not export, by prefix or
// exact name, with why.
var absentInFerry = map[string]string{
	"go_":                            "Go runtime internals; ferry is not written in Go",
	"goroutines":                     "Go runtime",
	"memstats_":                      "Go runtime memory statistics (process_resident_memory_bytes instead)",
	"derp_memstats_sys0":             "Go runtime memory statistics",
	"derp_buffered_write_frames_":    "derper's bufio flush batching; ferry writes one buffer per connection per turn",
	"derp_mesh_update_batch_size_":   "derper's watcher update goroutine",
	"derp_mesh_update_loop_count_":   "derper's watcher update goroutine",
	"derp_average_queue_duration_ms": "ferry keeps no per-packet enqueue times; ferry_queued_bytes and ferry_backpressure_* describe its queues",
	"goamd64_":                       "the x86-64 level Go compiled derper for and the one the CPU has",
	"stun_no_local_addr":             "derper answers STUN from the address each request came to (packet info from the kernel) and counts requests without it; ferry does not ask for that address",
}

func absentReason(name string) (string, bool) {
	for k, why := range absentInFerry {
		if name == k || (strings.HasSuffix(k, "_") && strings.HasPrefix(name, k)) {
			return why, true
		}
	}
	return "", false
}

func metricNames(t *testing.T, s *server) map[string]bool {
	t.Helper()
	samples, err := s.scrapeMetrics()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range samples {
		names[m.name] = true
	}
	return names
}

func TestDerperMetricNamesInFerry(t *testing.T) {
	if !contains(selectedServers, kindDerper) || !contains(selectedServers, kindFerry) {
		t.Skip("SKIP: needs both servers (INTEROP_SERVERS)")
	}
	derper := metricNames(t, startServer(t, kindDerper, serverOpts{mesh: true}))
	ferry := metricNames(t, startServer(t, kindFerry, serverOpts{mesh: true}))
	var missing, absent []string
	for name := range derper {
		if ferry[name] {
			continue
		}
		if why, ok := absentReason(name); ok {
			absent = append(absent, name+" ("+why+")")
			continue
		}
		missing = append(missing, name)
	}
	sort.Strings(missing)
	sort.Strings(absent)
	t.Logf("derper exports %d names, ferry %d; %d deliberately absent:\n  %s", len(derper), len(ferry), len(absent), strings.Join(absent, "\n  "))
	if len(missing) > 0 {
		t.Errorf("derper metrics ferry lacks with no stated reason: %s", strings.Join(missing, ", "))
	}
	// The list must not go stale: every entry still names something
	// derper has and ferry lacks.
	for k := range absentInFerry {
		used := false
		for name := range derper {
			if (name == k || (strings.HasSuffix(k, "_") && strings.HasPrefix(name, k))) && !ferry[name] {
				used = true
			}
		}
		if !used {
			t.Errorf("absentInFerry lists %q, which derper lacks or ferry now has", k)
		}
	}
}
