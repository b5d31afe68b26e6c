// gcp-server is a go-control-plane xDS server (ADS, state-of-the-world and
// delta) fed by newline-delimited JSON commands on stdin: the reference peer
// kube-discovery's xDS server is tested and benchmarked against. The command
// format is in README.md.
//
// One LinearCache per resource type behind a MuxCache: a command changes only
// the resources it names (a SnapshotCache would rebuild and re-version a
// whole snapshot per change), and LinearCache answers delta streams with just
// the changed resources, which is what the benchmark compares.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// command is one stdin line; exactly one field is set.
type command struct {
	Set          json.RawMessage `json:"set"`
	Delete       json.RawMessage `json:"delete"`
	Target       *target         `json:"target"`
	DeleteTarget string          `json:"delete_target"`
}

// assignment is a Cluster and its ClusterLoadAssignment.
type assignment struct {
	Cluster   string            `json:"cluster"`
	Endpoints []json.RawMessage `json:"endpoints"`
}

// target is a grpc-go `xds:///NAME` target: a Listener and RouteConfiguration NAME routing to Cluster.
type target struct {
	Name    string `json:"name"`
	Cluster string `json:"cluster"`
}

type caches struct {
	clusters, endpoints, listeners, routes *cachev3.LinearCache
	// The Clusters set so far. A Cluster is a function of its name alone, so a
	// set of a known cluster changes only its assignment: re-setting the Cluster
	// would push every CDS subscriber an unchanged Cluster (in SotW, the whole
	// set of them) on every endpoint change.
	known map[string]bool
}

func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err) // only well-formed messages built here
	}
	return a
}

func cluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads()},
		ConnectTimeout:       durationpb.New(time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	}
}

// endpoint parses ["ip", port, weight] or ["ip", port, weight, "HEALTH_STATUS"].
func endpoint(raw json.RawMessage) (*endpointv3.LbEndpoint, uint32, error) {
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil || len(parts) < 3 || len(parts) > 4 {
		return nil, 0, fmt.Errorf("endpoint %s: want [\"ip\", port, weight] or [\"ip\", port, weight, \"HEALTH\"]", raw)
	}
	var ip string
	var port, weight uint32
	health := "UNKNOWN"
	if err := errors.Join(json.Unmarshal(parts[0], &ip), json.Unmarshal(parts[1], &port), json.Unmarshal(parts[2], &weight)); err != nil {
		return nil, 0, fmt.Errorf("endpoint %s: %w", raw, err)
	}
	if len(parts) == 4 {
		if err := json.Unmarshal(parts[3], &health); err != nil {
			return nil, 0, fmt.Errorf("endpoint %s: health: %w", raw, err)
		}
	}
	hs, ok := corev3.HealthStatus_value[health]
	if !ok {
		return nil, 0, fmt.Errorf("endpoint %s: unknown health status %q (UNKNOWN, HEALTHY, UNHEALTHY, DRAINING, TIMEOUT, DEGRADED)", raw, health)
	}
	if net.ParseIP(ip) == nil || port == 0 || port > 65535 {
		return nil, 0, fmt.Errorf("endpoint %s: want an IP address and a port 1-65535", raw)
	}
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address:       ip,
				PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
			}}},
		}},
		HealthStatus:        corev3.HealthStatus(hs),
		LoadBalancingWeight: wrapperspb.UInt32(weight),
	}, weight, nil
}

// loadAssignment builds the assignment of a: one locality (grpc-go ignores a
// locality without weight, so it gets the sum of its endpoints' weights).
func loadAssignment(a assignment) (*endpointv3.ClusterLoadAssignment, error) {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: a.Cluster}
	if len(a.Endpoints) == 0 {
		return cla, nil
	}
	loc := &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{}}
	var sum uint32
	for _, raw := range a.Endpoints {
		ep, w, err := endpoint(raw)
		if err != nil {
			return nil, err
		}
		sum += w
		loc.LbEndpoints = append(loc.LbEndpoints, ep)
	}
	loc.LoadBalancingWeight = wrapperspb.UInt32(sum)
	cla.Endpoints = []*endpointv3.LocalityLbEndpoints{loc}
	return cla, nil
}

func grpcListener(t target) *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{ConfigSource: ads(), RouteConfigName: t.Name}},
		HttpFilters: []*hcmv3.HttpFilter{{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
		}},
	}
	return &listenerv3.Listener{Name: t.Name, ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(hcm)}}
}

func grpcRoute(t target) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{
		Name: t.Name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    t.Name,
			Domains: []string{t.Name},
			Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: t.Cluster}}},
			}},
		}},
	}
}

// oneOrMany decodes a JSON value that is either one T or an array of T.
func oneOrMany[T any](raw json.RawMessage) ([]T, error) {
	var many []T
	if len(raw) > 0 && raw[0] == '[' {
		err := json.Unmarshal(raw, &many)
		return many, err
	}
	var one T
	err := json.Unmarshal(raw, &one)
	return []T{one}, err
}

func (c *caches) apply(line []byte) error {
	var cmd command
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cmd); err != nil {
		return fmt.Errorf("not a command: %w", err)
	}
	n := 0
	for _, set := range []bool{len(cmd.Set) > 0, len(cmd.Delete) > 0, cmd.Target != nil, cmd.DeleteTarget != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("a command has exactly one of set, delete, target, delete_target")
	}
	switch {
	case len(cmd.Set) > 0:
		list, err := oneOrMany[assignment](cmd.Set)
		if err != nil {
			return fmt.Errorf("set: %w", err)
		}
		cls := map[string]types.Resource{}
		clas := map[string]types.Resource{}
		for _, a := range list {
			if a.Cluster == "" {
				return errors.New("set: cluster is empty")
			}
			cla, err := loadAssignment(a)
			if err != nil {
				return fmt.Errorf("set %s: %w", a.Cluster, err)
			}
			if !c.known[a.Cluster] {
				cls[a.Cluster] = cluster(a.Cluster)
			}
			clas[a.Cluster] = cla
		}
		// Clusters first: a subscriber then asks for the assignment it is about to get.
		if len(cls) > 0 {
			if err := c.clusters.UpdateResources(cls, nil); err != nil {
				return err
			}
			for name := range cls {
				c.known[name] = true
			}
		}
		return c.endpoints.UpdateResources(clas, nil)
	case len(cmd.Delete) > 0:
		names, err := oneOrMany[string](cmd.Delete)
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		if err := c.endpoints.UpdateResources(nil, names); err != nil {
			return err
		}
		for _, name := range names {
			delete(c.known, name)
		}
		return c.clusters.UpdateResources(nil, names)
	case cmd.Target != nil:
		if cmd.Target.Name == "" || cmd.Target.Cluster == "" {
			return errors.New("target: name and cluster are required")
		}
		if err := c.routes.UpdateResource(cmd.Target.Name, grpcRoute(*cmd.Target)); err != nil {
			return err
		}
		return c.listeners.UpdateResource(cmd.Target.Name, grpcListener(*cmd.Target))
	default:
		if err := c.listeners.DeleteResource(cmd.DeleteTarget); err != nil {
			return err
		}
		return c.routes.DeleteResource(cmd.DeleteTarget)
	}
}

// authorize checks the stream's `authorization: Bearer` metadata against
// the content of tokenFile (no file: every stream is let in).
func authorize(ctx context.Context, tokenFile string) error {
	if tokenFile == "" {
		return nil
	}
	want, err := os.ReadFile(tokenFile)
	if err != nil {
		return status.Errorf(codes.Unavailable, "reading the token file: %v", err)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if v == "Bearer "+strings.TrimSpace(string(want)) {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "missing or wrong bearer token")
}

// streamKind names a stream by its type URL (empty: ADS).
func streamKind(typeURL string) string {
	if typeURL == "" {
		return "ADS"
	}
	return typeURL
}

// quiet drops go-control-plane's debug and info logs (one line per watch).
type quiet struct{}

func (quiet) Debugf(string, ...any) {}
func (quiet) Infof(string, ...any)  {}
func (quiet) Warnf(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "gcp-server: warn: "+f+"\n", a...)
}
func (quiet) Errorf(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "gcp-server: error: "+f+"\n", a...)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "ip:port to serve ADS on")
	tokenFile := flag.String("token-file", "", "if set: streams must send `authorization: Bearer <the file's content>` (re-read per stream), others get UNAUTHENTICATED")
	flag.Parse()

	c := &caches{
		clusters:  cachev3.NewLinearCache(resourcev3.ClusterType, cachev3.WithLogger(quiet{})),
		endpoints: cachev3.NewLinearCache(resourcev3.EndpointType, cachev3.WithLogger(quiet{})),
		listeners: cachev3.NewLinearCache(resourcev3.ListenerType, cachev3.WithLogger(quiet{})),
		routes:    cachev3.NewLinearCache(resourcev3.RouteType, cachev3.WithLogger(quiet{})),
		known:     map[string]bool{},
	}
	mux := &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return r.GetTypeUrl() },
		Caches: map[string]cachev3.Cache{
			resourcev3.ClusterType:  c.clusters,
			resourcev3.EndpointType: c.endpoints,
			resourcev3.ListenerType: c.listeners,
			resourcev3.RouteType:    c.routes,
		},
	}
	var nacks atomic.Int64
	nack := func(kind string, id int64, typeURL string, msg string) {
		fmt.Fprintf(os.Stderr, "gcp-server: NACK #%d on %s stream %d (%s): %q\n", nacks.Add(1), kind, id, typeURL, msg)
	}
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(_ context.Context, id int64, typ string) error {
			fmt.Fprintf(os.Stderr, "gcp-server: sotw stream %d open %s\n", id, streamKind(typ))
			return nil
		},
		DeltaStreamOpenFunc: func(_ context.Context, id int64, typ string) error {
			fmt.Fprintf(os.Stderr, "gcp-server: delta stream %d open %s\n", id, streamKind(typ))
			return nil
		},
		StreamRequestFunc: func(id int64, r *discoverygrpc.DiscoveryRequest) error {
			if r.GetErrorDetail() != nil {
				nack("sotw", id, r.GetTypeUrl(), r.GetErrorDetail().GetMessage())
			}
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, r *discoverygrpc.DeltaDiscoveryRequest) error {
			if r.GetErrorDetail() != nil {
				nack("delta", id, r.GetTypeUrl(), r.GetErrorDetail().GetMessage())
			}
			return nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	xds := serverv3.NewServer(ctx, mux, cb)
	srv := grpc.NewServer(
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := authorize(ss.Context(), *tokenFile); err != nil {
				fmt.Fprintf(os.Stderr, "gcp-server: refused a stream: %v\n", err)
				return err
			}
			return h(srv, ss)
		}),
		grpc.MaxConcurrentStreams(1<<20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(srv, xds)

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gcp-server: listen %s: %v\n", *listen, err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	reply := func(v any) {
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	reply(map[string]string{"listen": lis.Addr().String()})
	go func() {
		if err := srv.Serve(lis); err != nil {
			fmt.Fprintf(os.Stderr, "gcp-server: serve: %v\n", err)
			os.Exit(1)
		}
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		srv.Stop()
		os.Exit(0)
	}()

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30)
	for seq := 1; in.Scan(); seq++ {
		if len(in.Bytes()) == 0 {
			seq--
			continue
		}
		if err := c.apply(in.Bytes()); err != nil {
			reply(map[string]any{"seq": seq, "error": err.Error()})
			continue
		}
		reply(map[string]any{"seq": seq, "ok": true})
	}
	// stdin closed: keep serving until a signal (the harness kills it).
	select {}
}
