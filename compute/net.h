/*
 * net.h - the network graph behind struct rt_model, private to compute/.
 *
 * A model is built once as a list of nodes in forward order (which is also
 * the order of the PyTorch module's state_dict for every architecture here).
 * Each node reads one or two tensors and writes one; forward runs the list,
 * backward runs it in reverse, and a tensor read by two nodes (a residual
 * input) gets its gradient summed through the ops' beta argument. Nothing
 * is decided per step: shapes, buffers and gradient-buffer reuse are planned
 * at build time.
 */
#ifndef RT_COMPUTE_NET_H
#define RT_COMPUTE_NET_H

#include "compute/compute.h"

enum net_init {
    NET_INIT_DEFAULT = 0,  /* PyTorch's layer defaults: kaiming_uniform(a=sqrt(5)), bias U(+-1/sqrt(fan_in)) */
    NET_INIT_FAN_OUT = 1,  /* conv weights N(0, sqrt(2 / (Cout kh kw))) (torchvision ResNet, WideResNet) */
};

struct net;

/* Builds on `ops` (borrowed; NULL: rt_backend_ops_for(be, act)). NULL with rt_errmsg() set when the backend has
 * no op table for `act` activations, or `ops` is not one (rt_model_opts.ops). */
struct net *net_create(struct rt_backend *be, struct rt_shape4 input, int classes, enum net_init init,
                       enum rt_dtype act, const struct rt_ops *ops);
enum rt_dtype net_act(const struct net *n);
void net_destroy(struct net *n);

/*
 * Layer builders, called in forward order. Tensors are int handles (0 is the
 * normalised input image). Each returns the output tensor, or -1 with
 * rt_errmsg() naming the layer (after which the net is unusable).
 */
int net_conv(struct net *n, int x, const char *name, int cout, int k, int stride, int pad, int bias);
int net_bn(struct net *n, int x, const char *name);
int net_relu(struct net *n, int x);
int net_maxpool(struct net *n, int x, const char *what, int k, int stride, int pad);
int net_global_maxpool(struct net *n, int x, const char *what);
int net_gap(struct net *n, int x, const char *what);     /* spatial -> features */
int net_flatten(struct net *n, int x, const char *what); /* spatial -> features */
int net_linear(struct net *n, int x, const char *name, int out, int bias);
/* Refused as node 256 or later, or over 2^32 or more elements (batch included): its masks would repeat
 * another layer's or micro-batch's (dropout_index.h). */
int net_dropout(struct net *n, int x, const char *what, float p);
int net_add(struct net *n, int a, int b, const char *what);
int net_scale(struct net *n, int x, const char *what, float alpha);

/* Allocates parameters, buffers, activations and gradients; initialises the
 * weights from `seed`. `logits` must be a (N, classes) feature tensor. */
int net_finish(struct net *n, int logits, uint64_t seed, const char *freeze); /* freeze: rt_model_opts.freeze */

/* What struct rt_model exposes, forwarded. */
const struct rt_tensor_info *net_tensors(const struct net *n, int *count);
size_t net_param_count(const struct net *n);
int net_node_count(const struct net *n); /* layers (ops) in the graph */
struct rt_backend *net_backend(const struct net *n);
size_t net_buffer_count(const struct net *n);
float *net_params(struct net *n);
float *net_grads(struct net *n);
float *net_buffers(struct net *n);
void net_zero_grads(struct net *n);
void net_read(struct net *n, enum rt_model_buf which, size_t offset, size_t count, float *dst);
void net_write(struct net *n, enum rt_model_buf which, size_t offset, const float *src, size_t count);
int64_t net_batches_tracked(const struct net *n);
void net_set_batches_tracked(struct net *n, int64_t v);
int64_t net_tracked(const struct net *n, int row);
void net_set_tracked(struct net *n, int row, int64_t v);
size_t net_trainable_count(const struct net *n);
size_t net_head_count(const struct net *n);
const char *net_head_name(const struct net *n);
int net_step(struct net *n, const struct rt_step_opts *o, int batch, const uint8_t *images, const int32_t *labels,
             struct rt_loss_stats *stats);
void net_logits(struct net *n, float *host, int batch);
const char *net_graph_status(const struct net *n, int *graphs, uint64_t *replays);
void net_find_nonfinite(struct net *n, char *buf, size_t len);

#endif
