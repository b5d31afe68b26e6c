// grpc-backend serves the standard gRPC health service (grpc.health.v1) on
// one address and tells every caller who answered: each response carries the
// header `backend: <listen address>`. The xDS tests start several of them as
// the endpoints a proxyless grpc-go client (xds-grpc-client) must reach.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

func main() {
	listen := flag.String("listen", "", "ip:port to serve on (required)")
	flag.Parse()
	if *listen == "" {
		fmt.Fprintln(os.Stderr, "grpc-backend: --listen ip:port is required")
		os.Exit(2)
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "grpc-backend: listen %s: %v\n", *listen, err)
		os.Exit(1)
	}
	self := lis.Addr().String()
	tag := func(ctx context.Context) error {
		return grpc.SetHeader(ctx, metadata.Pairs("backend", self))
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := tag(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := tag(ss.Context()); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		srv.GracefulStop()
	}()
	fmt.Printf("{\"listen\":%q}\n", self)
	if err := srv.Serve(lis); err != nil {
		fmt.Fprintf(os.Stderr, "grpc-backend: serve: %v\n", err)
		os.Exit(1)
	}
}
