package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds/bootstrap"
)

// insecureBearer is the bootstrap channel credential `insecure_bearer_token_file`
// ({"token_file": PATH}): plaintext, and `authorization: Bearer <token>` on
// every xDS call, the token read from the file each time (a rotated token is
// used at once). It is this test client's own: grpc-go's standard way, the
// call credential `jwt_token_file` (gRFC A97), needs TLS, a JWT with an `exp`
// claim and GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS=true.
type insecureBearer struct{}

func (insecureBearer) Name() string { return "insecure_bearer_token_file" }

func (insecureBearer) Build(config json.RawMessage) (credentials.Bundle, func(), error) {
	var cfg struct {
		TokenFile string `json:"token_file"`
	}
	if err := json.Unmarshal(config, &cfg); err != nil || cfg.TokenFile == "" {
		return nil, nil, fmt.Errorf("insecure_bearer_token_file: config must be {\"token_file\": PATH} (%v)", err)
	}
	return bearerBundle{Bundle: insecure.NewBundle(), file: cfg.TokenFile}, func() {}, nil
}

type bearerBundle struct {
	credentials.Bundle
	file string
}

func (b bearerBundle) PerRPCCredentials() credentials.PerRPCCredentials { return bearerToken(b.file) }

type bearerToken string

func (f bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + strings.TrimSpace(string(b))}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return false }

func init() { bootstrap.RegisterChannelCredentials(insecureBearer{}) }
