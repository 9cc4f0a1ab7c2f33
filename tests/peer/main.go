// Command upstream-upgrade drives NVIDIA's k8s-operator-libs upgrade state machine
// (pkg/upgrade's ClusterUpgradeStateManager) against a cluster, the way the GPU Operator's
// upgrade controller drives it, so that gpuop's rollout can be measured beside it on the same
// control plane (tests/bench/vs_upstream.py). See README.md beside this file for how it is
// driven and where it differs from the GPU Operator.
//
// One controller, one reconcile at a time, an exponential per-item back-off on errors, and a
// planned requeue after every pass. It is woken by a change of a node's upgrade-state label,
// by a generation change of a driver DaemonSet, and once at start (standing in for the
// ClusterPolicy watch: the policy comes from --policy, never changes, and there is no CRD).
//
// Every pass builds the cluster's upgrade state and applies the policy to it. A progress line
// goes to stdout whenever the count of nodes per state changes; on SIGTERM or SIGINT (or with
// --exit-when-done, once every driver node is upgrade-done with an up-to-date driver pod) it
// prints one JSON object as its last line.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/k8s-operator-libs/api/upgrade/v1alpha1"
	"github.com/NVIDIA/k8s-operator-libs/pkg/upgrade"
	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

const (
	libraryModule = "github.com/NVIDIA/k8s-operator-libs"
	// skipDrainSelector keeps pods that opt out of the driver-upgrade drain, as the GPU
	// Operator appends it to every drain pod selector.
	skipDrainSelector = "nvidia.com/gpu-driver-upgrade-drain.skip!=true"
	// Back-off bounds of the GPU Operator's controllers after a failed pass.
	backoffFirst = 100 * time.Millisecond
	backoffLast  = 3 * time.Second
)

// options are the command line.
type options struct {
	kubeconfig        string
	namespace         string
	driverLabels      map[string]string
	validatorSelector string
	policy            v1alpha1.DriverUpgradePolicySpec
	requeue           time.Duration
	exitWhenDone      bool
	verbosity         int
}

func parseOptions(args []string) (options, error) {
	var opts options
	flags := flag.NewFlagSet("upstream-upgrade", flag.ContinueOnError)
	flags.StringVar(&opts.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (required)")
	flags.StringVar(&opts.namespace, "namespace", "gpu-operator", "namespace of the driver DaemonSets")
	driverLabel := flags.String("driver-label", "app=nvidia-driver-daemonset",
		"key=value label of the driver DaemonSets and their pods")
	flags.StringVar(&opts.validatorSelector, "validator-selector", "app=nvidia-operator-validator",
		"label selector of the validator pods the validation state waits for (empty: no validation state)")
	policyPath := flags.String("policy", "",
		"JSON file holding the driver upgrade policy, as a ClusterPolicy's spec.driver.upgradePolicy (required)")
	flags.DurationVar(&opts.requeue, "requeue", 2*time.Minute, "planned requeue after every pass")
	flags.BoolVar(&opts.exitWhenDone, "exit-when-done", false,
		"exit once every driver node is upgrade-done with an up-to-date driver pod")
	flags.IntVar(&opts.verbosity, "v", 0, "log verbosity: 0 errors only, 1 info, 2 debug")
	if err := flags.Parse(args); err != nil {
		return opts, err
	}
	if opts.kubeconfig == "" {
		return opts, errors.New("--kubeconfig is required")
	}
	key, value, found := strings.Cut(*driverLabel, "=")
	if !found || key == "" {
		return opts, fmt.Errorf("--driver-label %q is not key=value", *driverLabel)
	}
	opts.driverLabels = map[string]string{key: value}
	if *policyPath == "" {
		return opts, errors.New("--policy is required")
	}
	raw, err := os.ReadFile(*policyPath)
	if err != nil {
		return opts, fmt.Errorf("--policy: %w", err)
	}
	decoder := json.NewDecoder(strings.NewReader(string(raw)))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&opts.policy); err != nil {
		return opts, fmt.Errorf("--policy %s: %w", *policyPath, err)
	}
	if !opts.policy.AutoUpgrade {
		return opts, fmt.Errorf("--policy %s: autoUpgrade is not true, nothing would be upgraded", *policyPath)
	}
	return opts, nil
}

// usesGPU is the pod-deletion filter: pods that ask for an NVIDIA GPU or MIG device.
func usesGPU(pod corev1.Pod) bool {
	for _, container := range pod.Spec.Containers {
		for _, resources := range []corev1.ResourceList{container.Resources.Requests, container.Resources.Limits} {
			for name := range resources {
				if strings.HasPrefix(string(name), "nvidia.com/gpu") || strings.HasPrefix(string(name), "nvidia.com/mig-") {
					return true
				}
			}
		}
	}
	return false
}

// progress records what the passes saw, for the progress lines and the summary.
type progress struct {
	mu       sync.Mutex
	started  time.Time
	passes   int
	failures int
	last     string
	counts   map[string]int
	finished chan struct{}
	once     sync.Once
}

func (p *progress) summary() map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return map[string]any{
		"library":  libraryModule,
		"version":  libraryVersion(),
		"passes":   p.passes,
		"failures": p.failures,
		"seconds":  time.Since(p.started).Seconds(),
		"states":   p.counts,
	}
}

func libraryVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == libraryModule {
			return dep.Version
		}
	}
	return "unknown"
}

// reconciler is one pass of the upgrade controller.
type reconciler struct {
	reader   client.Reader
	manager  upgrade.ClusterUpgradeStateManager
	opts     options
	progress *progress
	log      logr.Logger
}

func (r *reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	state, err := r.manager.BuildState(ctx, r.opts.namespace, r.opts.driverLabels)
	if err != nil {
		r.failed()
		return reconcile.Result{}, fmt.Errorf("building the upgrade state: %w", err)
	}
	policy := r.opts.policy.DeepCopy()
	total := r.manager.GetTotalManagedNodes(state)
	if policy.MaxUnavailable == nil {
		whole := intstr.FromInt(total)
		policy.MaxUnavailable = &whole
	}
	if policy.DrainSpec != nil {
		if policy.DrainSpec.PodSelector == "" {
			policy.DrainSpec.PodSelector = skipDrainSelector
		} else {
			policy.DrainSpec.PodSelector += "," + skipDrainSelector
		}
	}
	if err := r.manager.ApplyState(ctx, state, policy); err != nil {
		r.failed()
		return reconcile.Result{}, fmt.Errorf("applying the upgrade state: %w", err)
	}
	r.record(ctx, state, total)
	return reconcile.Result{RequeueAfter: r.opts.requeue}, nil
}

func (r *reconciler) failed() {
	r.progress.mu.Lock()
	r.progress.failures++
	r.progress.mu.Unlock()
}

// record prints a progress line when the count of nodes per state changed (as this pass
// found them, before it acted), and notices the end of the rollout.
func (r *reconciler) record(ctx context.Context, state *upgrade.ClusterUpgradeState, total int) {
	counts := map[string]int{}
	for name, nodes := range state.NodeStates {
		if name == "" {
			name = "unknown"
		}
		counts[name] = len(nodes)
	}
	names := make([]string, 0, len(counts))
	for name := range counts {
		names = append(names, name)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s=%d", name, counts[name]))
	}
	line := strings.Join(parts, " ")
	p := r.progress
	p.mu.Lock()
	p.passes++
	p.counts = counts
	changed := line != p.last
	p.last = line
	elapsed := time.Since(p.started).Seconds()
	p.mu.Unlock()
	if changed {
		fmt.Printf("progress %.1fs %s\n", elapsed, line)
	}
	if r.opts.exitWhenDone && total > 0 && counts[upgrade.UpgradeStateDone] == total && r.podsCurrent(ctx) {
		p.once.Do(func() { close(p.finished) })
	}
}

// podsCurrent: every driver DaemonSet's pods run its current template and are ready.
func (r *reconciler) podsCurrent(ctx context.Context) bool {
	var sets appsv1.DaemonSetList
	err := r.reader.List(ctx, &sets, client.InNamespace(r.opts.namespace), client.MatchingLabels(r.opts.driverLabels))
	if err != nil {
		return false
	}
	for _, ds := range sets.Items {
		status := ds.Status
		if status.ObservedGeneration < ds.Generation || status.UpdatedNumberScheduled != status.DesiredNumberScheduled ||
			status.NumberReady != status.DesiredNumberScheduled {
			return false
		}
	}
	return len(sets.Items) > 0
}

func run(opts options) error {
	log := zap.New(zap.UseDevMode(false), zap.WriteTo(os.Stderr), zap.Level(zapLevel(opts.verbosity)))
	ctrl.SetLogger(log)
	config, err := clientcmd.BuildConfigFromFlags("", opts.kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", opts.kubeconfig, err)
	}
	// ctrl.GetConfig's client limits, which the GPU Operator runs with.
	config.QPS, config.Burst = 20, 30
	manager, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:                 clientgoscheme.Scheme,
		Metrics:                server.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	upgrade.SetDriverName("gpu")
	states, err := upgrade.NewClusterUpgradeStateManager(log.WithName("upgrade"), manager.GetConfig(),
		manager.GetEventRecorderFor("upstream-upgrade"), upgrade.StateOptions{})
	if err != nil {
		return fmt.Errorf("creating the upgrade state manager: %w", err)
	}
	states = states.WithPodDeletionEnabled(usesGPU)
	if opts.validatorSelector != "" {
		states = states.WithValidationEnabled(opts.validatorSelector)
	}
	done := &progress{started: time.Now(), finished: make(chan struct{}), counts: map[string]int{}}
	pass := &reconciler{reader: manager.GetClient(), manager: states, opts: opts, progress: done, log: log}
	if err := watch(manager, pass, opts); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	go func() {
		select {
		case <-done.finished:
			cancel()
		case <-ctx.Done():
		}
	}()
	fmt.Printf("started: %s %s, driver pods %v in %s\n", libraryModule, libraryVersion(), opts.driverLabels, opts.namespace)
	if err := manager.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	summary, _ := json.Marshal(done.summary())
	fmt.Println(string(summary))
	return nil
}

// watch sets up the controller: what wakes a pass, one pass at a time.
func watch(manager ctrl.Manager, pass *reconciler, opts options) error {
	one := reconcile.Request{NamespacedName: types.NamespacedName{Name: "cluster-policy"}}
	wake := func(context.Context, client.Object) []reconcile.Request { return []reconcile.Request{one} }
	loop, err := controller.New("upgrade-controller", manager, controller.Options{
		Reconciler:              pass,
		MaxConcurrentReconciles: 1,
		RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](backoffFirst, backoffLast),
	})
	if err != nil {
		return fmt.Errorf("creating the controller: %w", err)
	}
	label := upgrade.GetUpgradeStateLabelKey()
	stateChanged := predicate.TypedFuncs[*corev1.Node]{
		UpdateFunc: func(e event.TypedUpdateEvent[*corev1.Node]) bool {
			return e.ObjectOld.Labels[label] != e.ObjectNew.Labels[label]
		},
	}
	nodes := source.Kind(manager.GetCache(), &corev1.Node{},
		handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, n *corev1.Node) []reconcile.Request {
			return wake(ctx, n)
		}), stateChanged)
	if err := loop.Watch(nodes); err != nil {
		return fmt.Errorf("watching nodes: %w", err)
	}
	driverSet := labels.SelectorFromSet(opts.driverLabels)
	isDriver := predicate.NewTypedPredicateFuncs(func(ds *appsv1.DaemonSet) bool {
		return ds.Namespace == opts.namespace && driverSet.Matches(labels.Set(ds.Labels))
	})
	sets := source.Kind(manager.GetCache(), &appsv1.DaemonSet{},
		handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, ds *appsv1.DaemonSet) []reconcile.Request {
			return wake(ctx, ds)
		}),
		predicate.And[*appsv1.DaemonSet](predicate.TypedGenerationChangedPredicate[*appsv1.DaemonSet]{}, isDriver))
	if err := loop.Watch(sets); err != nil {
		return fmt.Errorf("watching DaemonSets: %w", err)
	}
	// The first pass, where the GPU Operator's comes from its ClusterPolicy watch.
	start := make(chan event.TypedGenericEvent[*corev1.Node], 1)
	start <- event.TypedGenericEvent[*corev1.Node]{Object: &corev1.Node{}}
	kick := source.Channel(start, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, n *corev1.Node) []reconcile.Request {
		return wake(ctx, n)
	}))
	if err := loop.Watch(kick); err != nil {
		return fmt.Errorf("starting the first pass: %w", err)
	}
	return nil
}

// zapLevel: 0 shows errors only (the library logs every step at info), 1 info, 2 debug.
func zapLevel(verbosity int) zapcore.Level {
	if verbosity <= 0 {
		return zapcore.ErrorLevel
	}
	return zapcore.Level(1 - verbosity)
}

func main() {
	opts, err := parseOptions(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "upstream-upgrade: %v\n", err)
		os.Exit(2)
	}
	if err := run(opts); err != nil {
		fmt.Fprintf(os.Stderr, "upstream-upgrade: %v\n", err)
		os.Exit(1)
	}
}
