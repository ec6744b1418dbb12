/*
 * net.h - building a struct rt_model, private to compute/: models.c's
 * architectures call these builders; net.c implements them and the whole
 * public rt_model_* interface of compute.h (there is no other layer).
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

/*
 * Starts model `name` (copied, for rt_model_name) on `be` (borrowed) for inputs `input`, built on `ops`
 * (borrowed; NULL: rt_backend_ops_for(be, act)). Returns 0 with *out set, -ENOTSUP when the backend has no op
 * table for `act` activations, -EINVAL when `ops` is not one (rt_model_opts.ops), -ENOMEM; rt_errmsg() says
 * why. The layers come next, then net_finish; rt_model_destroy frees it at any point.
 */
int net_create(struct rt_backend *be, const char *name, struct rt_shape4 input, int classes, enum net_init init,
               enum rt_dtype act, const struct rt_ops *ops, struct rt_model **out);

/*
 * Layer builders, called in forward order. Tensors are int handles (0 is the
 * normalised input image). Each returns the output tensor, or -1 with
 * rt_errmsg() naming the layer (after which the net is unusable).
 */
int net_conv(struct rt_model *n, int x, const char *name, int cout, int k, int stride, int pad, int bias);
int net_bn(struct rt_model *n, int x, const char *name);
int net_relu(struct rt_model *n, int x);
int net_maxpool(struct rt_model *n, int x, const char *what, int k, int stride, int pad);
int net_global_maxpool(struct rt_model *n, int x, const char *what);
int net_gap(struct rt_model *n, int x, const char *what);     /* spatial -> features */
int net_flatten(struct rt_model *n, int x, const char *what); /* spatial -> features */
int net_linear(struct rt_model *n, int x, const char *name, int out, int bias);
/* Refused as node 256 or later, or over 2^32 or more elements (batch included): its masks would repeat
 * another layer's or micro-batch's (dropout_index.h). */
int net_dropout(struct rt_model *n, int x, const char *what, float p);
int net_add(struct rt_model *n, int a, int b, const char *what);
int net_scale(struct rt_model *n, int x, const char *what, float alpha);

/* Allocates parameters, buffers, activations and gradients; initialises the
 * weights from `seed`. `logits` must be a (N, classes) feature tensor. */
int net_finish(struct rt_model *n, int logits, uint64_t seed, const char *freeze); /* freeze: rt_model_opts.freeze */

#endif
