// xds-grpc-client is a proxyless grpc-go client: it dials an `xds:///NAME`
// target (grpc-go reads its bootstrap from GRPC_XDS_BOOTSTRAP, a file, or
// GRPC_XDS_BOOTSTRAP_CONFIG, the JSON itself), calls grpc.health.v1.Health/Check
// at a fixed rate and prints one JSON line per RPC on stdout:
//
//	{"t_ms":123,"ok":true,"backend":"198.18.0.1:5000","err":""}
//
// t_ms is when the RPC started, in ms since the client started; backend is
// the `backend` response header grpc-backend sets. It runs for --duration, or
// (--duration 0) until its stdin closes.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	_ "google.golang.org/grpc/xds" // registers the xds:/// resolver and balancers
)

type line struct {
	TMs     int64  `json:"t_ms"`
	OK      bool   `json:"ok"`
	Backend string `json:"backend"`
	Err     string `json:"err"`
}

func main() {
	target := flag.String("target", "", "target to dial, e.g. xds:///shop-web-http (required)")
	rate := flag.Float64("rate", 20, "RPCs per second")
	duration := flag.Duration("duration", 0, "how long to run; 0 = until stdin closes")
	timeout := flag.Duration("timeout", time.Second, "deadline of each RPC")
	flag.Parse()
	if *target == "" || *rate <= 0 {
		fmt.Fprintln(os.Stderr, "xds-grpc-client: --target is required and --rate must be > 0")
		os.Exit(2)
	}
	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "xds-grpc-client: dial %s: %v\n", *target, err)
		os.Exit(1)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	done := make(chan struct{})
	var once sync.Once
	stop := func() { once.Do(func() { close(done) }) }
	if *duration > 0 {
		time.AfterFunc(*duration, stop)
	} else {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			stop()
		}()
	}

	out := json.NewEncoder(os.Stdout)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	tick := time.NewTicker(time.Duration(float64(time.Second) / *rate))
	defer tick.Stop()
	for {
		select {
		case <-done:
			wg.Wait()
			return
		case <-tick.C:
		}
		wg.Add(1)
		go func(t time.Time) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			defer cancel()
			var md metadata.MD
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
			l := line{TMs: t.Sub(start).Milliseconds(), OK: err == nil}
			if v := md.Get("backend"); len(v) > 0 {
				l.Backend = v[0]
			}
			if err != nil {
				l.Err = err.Error()
			}
			mu.Lock()
			defer mu.Unlock()
			if err := out.Encode(l); err != nil {
				os.Exit(1) // stdout closed: nobody is reading any more
			}
		}(time.Now())
	}
}
