/*
 * models.c - the architectures ringtrain trains, built from net.c's layers
 * with the state_dict names of the PyTorch module of the same architecture
 * (tools/reference_models.py holds those modules; the parity tests compare
 * logits, loss and every gradient against them):
 *
 *   mnist-net  the PyTorch examples MNIST network, sized to the input
 *   resnet18   torchvision.models.resnet18(num_classes=K), ImageNet stem
 *   resnet50   torchvision.models.resnet50(num_classes=K): bottleneck blocks,
 *              stride on the 3x3 convolution (torchvision's "v1.5")
 *   resnet9    the DAWNBench ResNet-9 of the fastest CIFAR-10 recipes
 *   wrn-D-K    WideResNet-D-K (Zagoruyko & Komodakis), pre-activation blocks
 *
 * Input sizes: any height and width, square or not, that every layer's
 * output keeps at least 1 pixel. The ResNets and WideResNets pad every
 * convolution and pooling and end in a global average pool, so 1x1 is
 * enough; resnet9's three 2x2 max-pools need 8x8; mnist-net's two unpadded
 * 3x3 convolutions and 2x2 max-pool need 6x6 (and its fc1 is sized to the
 * input, so its checkpoints fit one input size only). A smaller input is
 * refused before anything is built, with the size it needs.
 *
 * It does not pick an architecture for a dataset nor know any dataset.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/net.h"

/* What a builder is told besides the net: the class count and, for a family, the numbers in its name. */
struct arch_args {
    int classes;
    int depth, widen; /* wrn-D-K */
};

static int conv_bn_relu(struct rt_model *n, int x, const char *prefix, int cout)
{
    char a[80], b[80];
    snprintf(a, sizeof(a), "%s.0", prefix);
    snprintf(b, sizeof(b), "%s.1", prefix);
    x = net_conv(n, x, a, cout, 3, 1, 1, 0);
    x = net_bn(n, x, b);
    return net_relu(n, x);
}

/* conv1 32, conv2 64, max-pool 2, dropout 0.25, fc1 128, dropout 0.5, fc2. */
static int build_mnist(struct rt_model *n, const struct arch_args *a)
{
    int x = net_conv(n, 0, "conv1", 32, 3, 1, 0, 1);
    x = net_relu(n, x);
    x = net_conv(n, x, "conv2", 64, 3, 1, 0, 1);
    x = net_relu(n, x);
    x = net_maxpool(n, x, "max_pool2d", 2, 2, 0);
    x = net_dropout(n, x, "dropout1", 0.25f);
    x = net_flatten(n, x, "flatten");
    x = net_linear(n, x, "fc1", 128, 1);
    x = net_relu(n, x);
    x = net_dropout(n, x, "dropout2", 0.5f);
    return net_linear(n, x, "fc2", a->classes, 1);
}

static int resnet_basic_block(struct rt_model *n, int x, const char *p, int cout, int stride)
{
    char nm[80];
    snprintf(nm, sizeof(nm), "%s.conv1", p);
    int y = net_conv(n, x, nm, cout, 3, stride, 1, 0);
    snprintf(nm, sizeof(nm), "%s.bn1", p);
    y = net_relu(n, net_bn(n, y, nm));
    snprintf(nm, sizeof(nm), "%s.conv2", p);
    y = net_conv(n, y, nm, cout, 3, 1, 1, 0);
    snprintf(nm, sizeof(nm), "%s.bn2", p);
    y = net_bn(n, y, nm);
    return y;
}

/* torchvision's Bottleneck: 1x1 to `width`, 3x3 (the stride is here), 1x1 to 4 x width. */
static int resnet_bottleneck(struct rt_model *n, int x, const char *p, int width, int stride)
{
    char nm[80];
    snprintf(nm, sizeof(nm), "%s.conv1", p);
    int y = net_conv(n, x, nm, width, 1, 1, 0, 0);
    snprintf(nm, sizeof(nm), "%s.bn1", p);
    y = net_relu(n, net_bn(n, y, nm));
    snprintf(nm, sizeof(nm), "%s.conv2", p);
    y = net_conv(n, y, nm, width, 3, stride, 1, 0);
    snprintf(nm, sizeof(nm), "%s.bn2", p);
    y = net_relu(n, net_bn(n, y, nm));
    snprintf(nm, sizeof(nm), "%s.conv3", p);
    y = net_conv(n, y, nm, 4 * width, 1, 1, 0, 0);
    snprintf(nm, sizeof(nm), "%s.bn3", p);
    return net_bn(n, y, nm);
}

/*
 * torchvision's ResNet: 7x7/2 stem, 3x3/2 max-pool, four stages of `blocks`
 * blocks at widths 64..512 (times 4 out of a bottleneck), the first block of
 * stages 2-4 striding, a 1x1 convolution + batchnorm shortcut ("downsample")
 * where the shape changes, global average pool, fc. The nodes are made in the
 * order of the module's state_dict, which the weights' seeding follows.
 */
static int build_resnet(struct rt_model *n, int classes, int bottleneck, const int blocks[4])
{
    int x = net_conv(n, 0, "conv1", 64, 7, 2, 3, 0);
    x = net_relu(n, net_bn(n, x, "bn1"));
    x = net_maxpool(n, x, "maxpool", 3, 2, 1);
    static const int widths[4] = {64, 128, 256, 512};
    const int expansion = bottleneck ? 4 : 1;
    int cin = 64;
    for (int l = 0; l < 4; l++) {
        const int cout = widths[l] * expansion;
        for (int b = 0; b < blocks[l]; b++) {
            char p[32], nm[80];
            snprintf(p, sizeof(p), "layer%d.%d", l + 1, b);
            int stride = (l > 0 && b == 0) ? 2 : 1;
            int y = bottleneck ? resnet_bottleneck(n, x, p, widths[l], stride)
                               : resnet_basic_block(n, x, p, widths[l], stride);
            int shortcut = x;
            if (stride != 1 || cin != cout) {
                snprintf(nm, sizeof(nm), "%s.downsample.0", p);
                shortcut = net_conv(n, x, nm, cout, 1, stride, 0, 0);
                snprintf(nm, sizeof(nm), "%s.downsample.1", p);
                shortcut = net_bn(n, shortcut, nm);
            }
            snprintf(nm, sizeof(nm), "%s (residual)", p);
            x = net_relu(n, net_add(n, y, shortcut, nm));
            cin = cout;
        }
    }
    x = net_gap(n, x, "avgpool");
    return net_linear(n, x, "fc", classes, 1);
}

static int build_resnet18(struct rt_model *n, const struct arch_args *a)
{
    static const int blocks[4] = {2, 2, 2, 2};
    return build_resnet(n, a->classes, 0, blocks);
}

static int build_resnet50(struct rt_model *n, const struct arch_args *a)
{
    static const int blocks[4] = {3, 4, 6, 3};
    return build_resnet(n, a->classes, 1, blocks);
}

/* prep 64; layer1 128 + pool + residual of two; layer2 256 + pool; layer3 512 +
 * pool + residual; global max-pool; fc without bias; output scaled by 1/8. */
static int build_resnet9(struct rt_model *n, const struct arch_args *a)
{
    int x = conv_bn_relu(n, 0, "prep", 64);
    x = conv_bn_relu(n, x, "layer1.0", 128);
    x = net_maxpool(n, x, "layer1.1", 2, 2, 0);
    int r = conv_bn_relu(n, x, "res1.0", 128);
    r = conv_bn_relu(n, r, "res1.1", 128);
    x = net_add(n, x, r, "res1 (residual)");
    x = conv_bn_relu(n, x, "layer2.0", 256);
    x = net_maxpool(n, x, "layer2.1", 2, 2, 0);
    x = conv_bn_relu(n, x, "layer3.0", 512);
    x = net_maxpool(n, x, "layer3.1", 2, 2, 0);
    r = conv_bn_relu(n, x, "res3.0", 512);
    r = conv_bn_relu(n, r, "res3.1", 512);
    x = net_add(n, x, r, "res3 (residual)");
    x = net_global_maxpool(n, x, "pool");
    x = net_flatten(n, x, "flatten");
    x = net_linear(n, x, "fc", a->classes, 0);
    return net_scale(n, x, "scale 0.125", 0.125f);
}

/* WideResNet pre-activation block: when the width changes, bn1/relu1 feed
 * both paths and the shortcut is a 1x1 convolution of the activated input. */
static int wrn_block(struct rt_model *n, int x, const char *p, int cin, int cout, int stride)
{
    char nm[80];
    int equal = cin == cout;
    snprintf(nm, sizeof(nm), "%s.bn1", p);
    int a = net_relu(n, net_bn(n, x, nm));
    snprintf(nm, sizeof(nm), "%s.conv1", p);
    int y = net_conv(n, a, nm, cout, 3, stride, 1, 0);
    snprintf(nm, sizeof(nm), "%s.bn2", p);
    y = net_relu(n, net_bn(n, y, nm));
    snprintf(nm, sizeof(nm), "%s.conv2", p);
    y = net_conv(n, y, nm, cout, 3, 1, 1, 0);
    int shortcut = x;
    if (!equal) {
        snprintf(nm, sizeof(nm), "%s.convShortcut", p);
        shortcut = net_conv(n, a, nm, cout, 1, stride, 0, 0);
    }
    snprintf(nm, sizeof(nm), "%s (residual)", p);
    return net_add(n, shortcut, y, nm);
}

static int parse_wrn(const char *name, int *depth, int *widen)
{
    char tail;
    if (sscanf(name, "wrn-%d-%d%c", depth, widen, &tail) != 2)
        return -EINVAL;
    if (*depth < 10 || (*depth - 4) % 6 != 0 || *widen < 1 || *widen > 64)
        return rt_errf(-EINVAL, "%s: WideResNet depth must be 6n+4 with n >= 1 (10, 16, 22, 28, 40) and the "
                                "widen factor 1..64",
                       name);
    return 0;
}

static int build_wrn(struct rt_model *n, const struct arch_args *a)
{
    int per = (a->depth - 4) / 6;
    int widths[4] = {16, 16 * a->widen, 32 * a->widen, 64 * a->widen};
    int x = net_conv(n, 0, "conv1", 16, 3, 1, 1, 0);
    int cin = 16;
    for (int g = 0; g < 3; g++) {
        for (int b = 0; b < per; b++) {
            char p[48];
            snprintf(p, sizeof(p), "block%d.layer.%d", g + 1, b);
            int stride = (g > 0 && b == 0) ? 2 : 1;
            x = wrn_block(n, x, p, cin, widths[g + 1], stride);
            cin = widths[g + 1];
        }
    }
    x = net_relu(n, net_bn(n, x, "bn1"));
    x = net_gap(n, x, "avgpool");
    return net_linear(n, x, "fc", a->classes, 1);
}

/*
 * The architectures. min_hw is the smallest height and width (each) that
 * leaves every layer's output at least 1 pixel: the ResNets and WideResNets
 * pad every window and pool globally at the end, so any input is enough.
 */
static const struct arch {
    const char *name; /* of a family: the prefix its names start with */
    int family;       /* the name's tail carries numbers (parsed into struct arch_args) */
    enum net_init init;
    int min_hw;
    const char *min_why; /* what needs min_hw, for the error */
    int (*build)(struct rt_model *n, const struct arch_args *a);
} archs[] = {
    {"mnist-net", 0, NET_INIT_DEFAULT, 6, "conv1 and conv2, 3x3 unpadded, then its 2x2 max-pool", build_mnist},
    {"resnet18", 0, NET_INIT_FAN_OUT, 1, NULL, build_resnet18},
    {"resnet50", 0, NET_INIT_FAN_OUT, 1, NULL, build_resnet50},
    {"resnet9", 0, NET_INIT_DEFAULT, 8, "its three 2x2 max-pools, in layer1, layer2 and layer3", build_resnet9},
    {"wrn-", 1, NET_INIT_FAN_OUT, 1, NULL, build_wrn},
};

const char *rt_model_names(void)
{
    return "mnist-net, resnet18, resnet50, resnet9, wrn-D-K (e.g. wrn-16-4, wrn-28-10)";
}

int rt_model_create(struct rt_backend *be, const struct rt_model_opts *o, struct rt_model **out)
{
    *out = NULL;
    const char *name = o->name ? o->name : "";
    const struct arch *arch = NULL;
    for (size_t i = 0; i < RT_ARRAY_LEN(archs) && !arch; i++)
        if (archs[i].family ? !strncmp(name, archs[i].name, strlen(archs[i].name)) : !strcmp(name, archs[i].name))
            arch = &archs[i];
    struct arch_args args = {.classes = o->classes};
    if (arch && arch->build == build_wrn) {
        rt_errclear();
        int rc = parse_wrn(name, &args.depth, &args.widen);
        if (rc == -EINVAL && !rt_errmsg()[0])
            return rt_errf(-EINVAL, "unknown model '%s': WideResNet is wrn-DEPTH-WIDEN, e.g. wrn-16-4", name);
        if (rc)
            return rc;
    }
    if (!arch)
        return rt_errf(-EINVAL, "unknown model '%s' (models: %s)", name, rt_model_names());
    if (o->classes < 2 || o->batch < 1 || o->c < 1 || o->h < 1 || o->w < 1)
        return rt_errf(-EINVAL, "%s: bad configuration: %d classes, batch %d, input %dx%dx%d", name, o->classes,
                       o->batch, o->c, o->h, o->w);
    if (o->h < arch->min_hw || o->w < arch->min_hw)
        return rt_errf(-EINVAL, "%s: input %dx%dx%d too small: needs at least %dx%d (%s)", name, o->c, o->h, o->w,
                       arch->min_hw, arch->min_hw, arch->min_why);

    struct rt_model *m;
    const struct rt_shape4 in = {o->batch, o->c, o->h, o->w};
    int rc = net_create(be, name, in, o->classes, arch->init, o->act, o->ops, &m);
    if (rc < 0)
        return rc;
    rt_errclear();
    const int logits = arch->build(m, &args);
    rc = logits < 0 ? -EINVAL : net_finish(m, logits, o->seed, o->freeze);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", rt_errmsg());
        rt_model_destroy(m);
        return rt_errf(rc, "%s on %dx%dx%d input: %s", name, o->c, o->h, o->w, msg);
    }
    *out = m;
    return 0;
}
