// Package clustertest starts a real control plane (etcd and kube-apiserver
// built from their Go modules by `make tools`, run on 127.0.0.1 with TLS,
// RBAC authorization and an admin kubeconfig by controller-runtime's
// envtest) with the localdir CRDs installed, and runs localdir controller
// and node plugins in-process against it.
//
// The plugins do not get the admin identity: they run with the permissions
// deploy/kubernetes gives them. The ServiceAccounts, (Cluster)Roles,
// (Cluster)RoleBindings and the node-scope ValidatingAdmissionPolicy of
// `kubectl kustomize deploy/kubernetes` are created in the API server. The
// controller authenticates with a client certificate as the ServiceAccount
// its Deployment names (ControllerIdentity); a node plugin with the token a
// kubelet gives its DaemonSet pod: a service-account token bound to a Pod on
// that node, which carries the node's name (NodeIdentity). The admin client
// stays for the tests' own checks.
package clustertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/cluster"
	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/metrics"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// Root is the repository root (found from `go env GOMOD`).
func Root(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// ToolsDir holds etcd, kube-apiserver and kubectl built by `make tools`.
func ToolsDir(t testing.TB) string {
	dir := filepath.Join(Root(t), "_output", "tools", "bin")
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%s is missing: run `make tools` first (builds etcd and kube-apiserver from their Go modules into %s)", b, dir)
		}
	}
	return dir
}

// Env is a running control plane.
type Env struct {
	Config     *rest.Config  // admin (system:masters): for the tests' own checks
	Client     client.Client // admin client
	Kubeconfig string        // admin kubeconfig file
	env        *envtest.Environment
	dir        string // kubeconfig files, for as long as the control plane runs

	idsMu sync.Mutex
	ids   *identities // the plugins' identities, made at first use
}

// Identity is a user of the API server: the ServiceAccount a localdir
// component runs as in deploy/kubernetes.
type Identity struct {
	// User is the user name the API server sees:
	// system:serviceaccount:<namespace>:<name>, which the RBAC bindings'
	// ServiceAccount subjects match.
	User       string
	Config     *rest.Config
	Kubeconfig string // a kubeconfig file with its client certificate
}

type identities struct {
	controller Identity
	nodeUser   string              // system:serviceaccount:<namespace>:<name> of the DaemonSet
	nodes      map[string]Identity // by node id
	unbound    Identity            // the DaemonSet's ServiceAccount with a token bound to no object
}

// Start brings up etcd and kube-apiserver with the localdir CRDs from
// deploy/kubernetes/crds, and stops them when the test ends.
func Start(t testing.TB) *Env {
	t.Helper()
	return StartWithCRDs(t, CRDDir(t))
}

// CRDDir is deploy/kubernetes/crds, the CRDs `make generate` writes.
func CRDDir(t testing.TB) string { return filepath.Join(Root(t), "deploy", "kubernetes", "crds") }

// StartWithCRDs is Start with the CRDs of crdDir (an earlier release's, for
// upgrade tests).
func StartWithCRDs(t testing.TB, crdDir string) *Env {
	t.Helper()
	return start(t, crdDir, "")
}

// StartWithFeatureGates is Start with the API server's --feature-gates
// (e.g. "MutablePVNodeAffinity=true").
func StartWithFeatureGates(t testing.TB, gates string) *Env {
	t.Helper()
	return start(t, CRDDir(t), gates)
}

func start(t testing.TB, crdDir, gates string) *Env {
	t.Helper()
	testdriver.RequireRoot(t)
	env := &envtest.Environment{
		BinaryAssetsDirectory:    ToolsDir(t),
		CRDDirectoryPaths:        []string{crdDir},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 2 * time.Minute,
	}
	env.ControlPlane.GetAPIServer().Configure().Append("service-cluster-ip-range", "10.0.0.0/24")
	if gates != "" {
		env.ControlPlane.GetAPIServer().Configure().Append("feature-gates", gates)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kc, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return &Env{Config: cfg, Client: c, Kubeconfig: kc, env: env, dir: dir}
}

// InstallCRDs creates or updates the CRDs of crdDir, as `kubectl apply`
// of a new release would, and waits until the API server serves them.
func (e *Env) InstallCRDs(t testing.TB, crdDir string) {
	t.Helper()
	if _, err := envtest.InstallCRDs(e.Config, envtest.CRDInstallOptions{Paths: []string{crdDir}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install CRDs of %s: %v", crdDir, err)
	}
}

// accessKinds are the objects of deploy/kubernetes that make up the
// components' permissions (the Namespace holds the ServiceAccounts and
// Roles; the admission policy narrows the node plugin's writes to its node).
var accessKinds = map[string]bool{
	"Namespace": true, "ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true,
	"Role": true, "RoleBinding": true, "ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
	"ConfigMap": true, // the controller's certificates, which it may only update
	"Secret":    true, // the snapshot metadata sidecar's certificate, which the controller may only update
}

// identitiesLocked renders and applies deploy/kubernetes' permissions on
// first use. Called with idsMu held.
func (e *Env) identitiesLocked(t testing.TB) *identities {
	t.Helper()
	if e.ids == nil {
		ids, err := e.applyAccess(t)
		if err != nil {
			t.Fatalf("deploy/kubernetes RBAC and admission policy: %v", err)
		}
		e.ids = ids
	}
	return e.ids
}

// ControllerIdentity is the controller's identity, with exactly the
// permissions deploy/kubernetes gives it: on first use deploy/kubernetes
// is rendered (kubectl kustomize, kubectl from `make tools`), its
// Namespace, ServiceAccounts, (Cluster)Roles, (Cluster)RoleBindings and
// admission policy are created with the admin client, and a client
// certificate is issued for the ServiceAccount the controller Deployment
// names. The API server authorizes with RBAC only, so any call outside its
// rules is Forbidden.
func (e *Env) ControllerIdentity(t testing.TB) Identity {
	t.Helper()
	e.idsMu.Lock()
	defer e.idsMu.Unlock()
	return e.identitiesLocked(t).controller
}

// NodeIdentity is the identity of the node plugin of nodeID, as a kubelet
// gives it to the DaemonSet's pod: a Pod on nodeID running as the
// DaemonSet's ServiceAccount is created (never run: no kubelet here) and a
// token bound to it requested, which the API server authenticates as that
// ServiceAccount with the node's name in the user's extra info
// (authentication.kubernetes.io/node-name). RBAC and the node-scope policy
// of deploy/kubernetes apply, as for ControllerIdentity.
func (e *Env) NodeIdentity(t testing.TB, nodeID string) Identity {
	t.Helper()
	e.idsMu.Lock()
	defer e.idsMu.Unlock()
	ids := e.identitiesLocked(t)
	if id, ok := ids.nodes[nodeID]; ok {
		return id
	}
	ns, sa := splitUser(ids.nodeUser)
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "localdir-node-" + dnsLabel(nodeID), Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: nodeID, ServiceAccountName: sa, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "localdir", Image: "localdir/localdir-csi"}},
		},
	}
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	if pod, err = cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("node identity of %s: create its pod: %v", nodeID, err)
	}
	id, err := e.tokenIdentity(ctx, ns, sa, &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		"kubeconfig-node-"+dnsLabel(nodeID))
	if err != nil {
		t.Fatalf("node identity of %s: %v", nodeID, err)
	}
	ids.nodes[nodeID] = id
	return id
}

// UnboundNodeToken is a token of the node plugin's ServiceAccount bound to
// no object: it authenticates as the node plugin but names no node.
func (e *Env) UnboundNodeToken(t testing.TB) Identity {
	t.Helper()
	e.idsMu.Lock()
	defer e.idsMu.Unlock()
	return e.identitiesLocked(t).unbound
}

// tokenIdentity requests a token of ServiceAccount ns/sa (bound to ref,
// when set) and returns the identity that uses it, with a kubeconfig file
// named file.
func (e *Env) tokenIdentity(ctx context.Context, ns, sa string, ref *authnv1.BoundObjectReference, file string) (Identity, error) {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return Identity{}, err
	}
	// Longer than any test: the kubelet would renew it.
	exp := int64((6 * time.Hour).Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{BoundObjectRef: ref, ExpirationSeconds: &exp},
	}, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, fmt.Errorf("token request for %s/%s: %w", ns, sa, err)
	}
	cfg := rest.AnonymousClientConfig(e.Config)
	cfg.BearerToken = tr.Status.Token
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(e.dir, file)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return Identity{}, err
	}
	return Identity{User: "system:serviceaccount:" + ns + ":" + sa, Config: cfg, Kubeconfig: path}, nil
}

// splitUser splits system:serviceaccount:<namespace>:<name>.
func splitUser(user string) (ns, name string) {
	parts := strings.Split(user, ":")
	return parts[2], parts[3]
}

var notDNSLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// dnsLabel is s in lower case with anything but letters, digits and '-'
// replaced by '-'.
func dnsLabel(s string) string {
	return strings.Trim(notDNSLabel.ReplaceAllString(strings.ToLower(s), "-"), "-")
}

func (e *Env) applyAccess(t testing.TB) (*identities, error) {
	root := Root(t)
	out, err := exec.Command(filepath.Join(ToolsDir(t), "kubectl"), "kustomize", filepath.Join(root, "deploy", "kubernetes")).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("kubectl kustomize deploy/kubernetes: %w (run `make tools`)", err)
	}
	accounts := map[string]string{} // workload kind → system:serviceaccount:ns:name
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
		switch k := u.GetKind(); {
		case accessKinds[k]:
			objs = append(objs, u)
		case k == "Deployment" || k == "DaemonSet":
			sa, _, _ := unstructured.NestedString(u.Object, "spec", "template", "spec", "serviceAccountName")
			if sa == "" {
				return nil, fmt.Errorf("%s %s names no serviceAccountName", k, u.GetName())
			}
			accounts[k] = "system:serviceaccount:" + u.GetNamespace() + ":" + sa
		}
	}
	if accounts["Deployment"] == "" || accounts["DaemonSet"] == "" {
		return nil, fmt.Errorf("deploy/kubernetes has no controller Deployment or node DaemonSet (%v)", accounts)
	}
	ctx := context.Background()
	// Namespaces and ServiceAccounts first: the rest refers to them.
	for _, first := range []bool{true, false} {
		for _, u := range objs {
			if k := u.GetKind(); (k == "Namespace" || k == "ServiceAccount") != first {
				continue
			}
			if err := e.Client.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("create %s %s: %w", u.GetKind(), u.GetName(), err)
			}
		}
	}
	ids := &identities{nodeUser: accounts["DaemonSet"], nodes: map[string]Identity{}}
	user := accounts["Deployment"]
	ns, _ := splitUser(user)
	au, err := e.env.AddUser(envtest.User{Name: user, Groups: []string{
		"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated",
	}}, nil)
	if err != nil {
		return nil, err
	}
	raw, err := au.KubeConfig()
	if err != nil {
		return nil, err
	}
	kc := filepath.Join(e.dir, "kubeconfig-controller")
	if err := os.WriteFile(kc, raw, 0o600); err != nil {
		return nil, err
	}
	ids.controller = Identity{User: user, Config: au.Config(), Kubeconfig: kc}
	if ids.unbound, err = e.waitNodeScope(ctx, ids.nodeUser); err != nil {
		return nil, err
	}
	return ids, nil
}

// waitNodeScope waits until the API server enforces the node-scope policy
// (it loads a new policy within seconds): a write of the node plugin's
// ServiceAccount with a token that names no node is refused. A probe that
// got through before then is removed. It returns that token's identity.
func (e *Env) waitNodeScope(ctx context.Context, nodeUser string) (Identity, error) {
	ns, sa := splitUser(nodeUser)
	id, err := e.tokenIdentity(ctx, ns, sa, nil, "kubeconfig-node-unbound")
	if err != nil {
		return Identity{}, err
	}
	c, err := client.New(id.Config, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		return Identity{}, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		probe := &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "node-scope-probe"}}
		err := c.Create(ctx, probe)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "no node name") {
			return id, nil
		}
		if err == nil {
			if derr := e.Client.Delete(ctx, probe); derr != nil {
				return Identity{}, derr
			}
		}
		if time.Now().After(deadline) {
			return Identity{}, fmt.Errorf("the node-scope admission policy is not enforced after a minute (last probe: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Plugin is a running localdir process (in-process) and a client to it.
type Plugin struct {
	Endpoint   string
	Dir        string
	Opts       driver.Options
	Conn       *grpc.ClientConn
	Controller csi.ControllerClient
	Node       csi.NodeClient
	Identity   csi.IdentityClient
	cancel     context.CancelFunc
	done       chan error
}

// StartController runs a controller-mode driver against e, as the
// controller's ServiceAccount (ControllerIdentity), and serves /metrics as app.Run
// does when o.MetricsAddress is set.
func (e *Env) StartController(t testing.TB, mutate func(*driver.Options)) *Plugin {
	t.Helper()
	dir := testdriver.TempDir(t)
	o := testdriver.DefaultOptions(dir)
	o.Mode = driver.ModeController
	o.Namespace = "localdir" // deploy/kubernetes' namespace
	if mutate != nil {
		mutate(&o)
	}
	cfg := rest.CopyConfig(e.ControllerIdentity(t).Config)
	cfg.QPS, cfg.Burst = o.KubeAPIQPS, o.KubeAPIBurst
	b, err := cluster.NewControllerBackend(t.Context(), cfg, o.MaxVolumeBytes)
	if err != nil {
		t.Fatal(err)
	}
	b.Wait = 30 * time.Second
	// The Lease of deploy/kubernetes' namespace, where the controller's
	// Role lets it elect the mover; one identity per controller started.
	if _, err := b.StartMover(t.Context(), cfg, o.DriverName, &cluster.MoverLease{Namespace: "localdir", Identity: fmt.Sprintf("controller-%p", b)}); err != nil {
		t.Fatal(err)
	}
	// Its channel certificate for changed block tracking, in the same
	// namespace; one per controller started.
	ranges, err := app.ServeControllerRanges(t.Context(), o, cfg, b, fmt.Sprintf("controller-%p", b))
	if err != nil {
		t.Fatal(err)
	}
	if ranges != nil {
		go func() { _ = ranges() }()
	}
	d, err := driver.NewController(o, b)
	if err != nil {
		t.Fatal(err)
	}
	return runPlugin(t, dir, o, withMetrics(t, o, cfg, func() []metrics.Sample { return b.MetricSamples(t.Context()) }, d.Run))
}

// StartNode runs a node-mode driver (gRPC Node service plus the node
// agent) for nodeID against e, with its own data root.
func (e *Env) StartNode(t testing.TB, nodeID string, mutate func(*driver.Options)) *Plugin {
	t.Helper()
	dir := testdriver.TempDir(t)
	o := testdriver.DefaultOptions(dir)
	o.Mode = driver.ModeNode
	o.NodeID = nodeID
	o.Namespace = "localdir"
	if mutate != nil {
		mutate(&o)
	}
	return e.StartNodeWith(t, dir, o)
}

// StartNodeWith runs a node plugin with exactly these options (for
// restarts on the same data root), as the node plugin of o.NodeID
// (NodeIdentity).
func (e *Env) StartNodeWith(t testing.TB, dir string, o driver.Options) *Plugin {
	t.Helper()
	nodeID := e.NodeIdentity(t, o.NodeID)
	d, n, err := app.NewDriver(o, nil)
	if err != nil {
		t.Fatal(err)
	}
	agent := &cluster.NodeAgent{NodeID: o.NodeID, Store: n.Store, Snapshots: n.Store.Snapshots(), Version: driver.Version(), Heartbeat: 2 * time.Second}
	cfg := rest.CopyConfig(nodeID.Config)
	cfg.QPS, cfg.Burst = o.KubeAPIQPS, o.KubeAPIBurst
	xfer, err := app.NewTransfer(o, cfg, n.Store)
	if err != nil {
		t.Fatal(err)
	}
	return runPlugin(t, dir, o, func(ctx context.Context) error {
		// Like app.Run: when either half fails, both stop.
		errc := make(chan error, 1)
		actx, cancel := context.WithCancel(ctx)
		if xfer != nil {
			agent.Transfer = xfer.Agent
			go func() {
				if err := xfer.Serve(actx); err != nil {
					t.Errorf("transfer channel of %s: %v", o.NodeID, err)
				}
			}()
		}
		go func() { errc <- agent.Start(actx, cfg); cancel() }()
		err := d.Serve(actx)
		cancel()
		if aerr := <-errc; err == nil {
			err = aerr
		}
		// Close the state file only after the agent stopped using it.
		if cerr := d.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

func runPlugin(t testing.TB, dir string, o driver.Options, serve func(context.Context) error) *Plugin {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Plugin{Endpoint: o.Endpoint, Dir: dir, Opts: o, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- serve(ctx) }()
	sock := strings.TrimPrefix(o.Endpoint, "unix://")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		select {
		case err := <-p.done:
			t.Fatalf("plugin exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket %s did not appear", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient(o.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.Conn = conn
	p.Controller, p.Node, p.Identity = csi.NewControllerClient(conn), csi.NewNodeClient(conn), csi.NewIdentityClient(conn)
	t.Cleanup(func() { p.Stop(t) })
	return p
}

// Stop stops the plugin; safe to repeat.
func (p *Plugin) Stop(t testing.TB) {
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	_ = p.Conn.Close()
	select {
	case err := <-p.done:
		if err != nil && !strings.Contains(err.Error(), "context canceled") {
			t.Errorf("plugin stopped with error: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("plugin did not stop within 30s")
	}
}

// WaitLocalNode waits until the node plugin of nodeID has written its
// LocalNode.
func (e *Env) WaitLocalNode(t testing.TB, nodeID string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ln := &v1.LocalNode{}
		if err := e.Client.Get(context.Background(), client.ObjectKey{Name: nodeID}, ln); err == nil && ln.Status.CapacityBytes.Value() > 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("LocalNode %s did not appear", nodeID)
}
