// kvq_quant.glsl — the quantisers of the KV cache's storage types, equal to
// the CPU's bit for bit (see kvq.glsl): ekv_f32_to_fp16, ekv_quant_q8_0,
// ekv_quant_q4_0 and ekv_kivi_quant_group. Needs shaderFloat64.

// ekv_f32_to_fp16: round to nearest even, in integers
uint f16_bits(float f) {
    const uint x = floatBitsToUint(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u);
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a < 0x38800000u) {
        if (a < 0x33000000u) return sign;
        const uint mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23);
        uint h = mant >> shift;
        const uint rem = mant & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (h & 1u) != 0u)) h++;
        return sign | h;
    }
    uint h = (a >> 13) - ((127u - 15u) << 10);
    const uint rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h++;
    return sign | h;
}

float f16_val(uint bits) { return unpackHalf2x16(bits).x; }

#ifndef KVQ_NO_F64

// a / b correctly rounded to float
float fdiv(float a, float b) { return float(double(a) / double(b)); }

// C's roundf: halfway cases away from zero
float round_away(float v) {
    precise float t = trunc(v);
    if (abs(v - t) >= 0.5) t = t + sign(v);
    return t;
}

// ekv_quant_q8_0 of 32 values: the fp16 scale bits; codes as 8 words
uint quant_q8_0(float x[32], out uint w[8]) {
    float amax = 0.0;
    for (uint i = 0; i < 32u; i++) amax = max(amax, abs(x[i]));
    const float d = fdiv(amax, 127.0);
    const float id = d != 0.0 ? fdiv(1.0, d) : 0.0;
    for (uint k = 0; k < 8u; k++) {
        uint u = 0u;
        for (uint i = 0; i < 4u; i++) {
            precise float v = x[4u * k + i] * id;
            u |= (uint(int(round_away(v))) & 0xffu) << (8u * i);
        }
        w[k] = u;
    }
    return f16_bits(d);
}

// ekv_quant_q4_0 of 32 values: byte i = code i | code (i + 16) << 4
uint quant_q4_0(float x[32], out uint w[4]) {
    float amax = 0.0, mx = 0.0; // mx: the first value of largest magnitude, with its sign
    for (uint i = 0; i < 32u; i++)
        if (amax < abs(x[i])) {
            amax = abs(x[i]);
            mx = x[i];
        }
    const float d = fdiv(mx, -8.0);
    const float id = d != 0.0 ? fdiv(1.0, d) : 0.0;
    for (uint k = 0; k < 4u; k++) w[k] = 0u;
    for (uint i = 0; i < 16u; i++) {
        precise float v0 = x[i] * id + 8.5, v1 = x[i + 16u] * id + 8.5;
        const uint q0 = v0 <= 0.0 ? 0u : min(15u, uint(v0)), q1 = v1 <= 0.0 ? 0u : min(15u, uint(v1));
        w[i / 4u] |= (q0 | (q1 << 4)) << (8u * (i % 4u));
    }
    return f16_bits(d);
}

// ekv_kivi_quant_group's scale and minimum from the group's min and max:
// the parameter word (fp16 scale | fp16 min << 16); sh, mnh: their values
// (sh 0 for a constant group: every code 0)
uint kivi_params(float mn, float mx, uint bits, out float sh, out float mnh) {
    const float qmax = float((1u << bits) - 1u);
    const uint m16 = f16_bits(mn);
    precise float span = mx - mn;
    const uint s16 = f16_bits(fdiv(span, qmax));
    mnh = f16_val(m16);
    sh = f16_val(s16);
    if (!(mx > mn) || !(sh > 0.0) || isinf(sh) || isnan(sh)) {
        sh = 0.0;
        return m16 << 16;
    }
    return s16 | (m16 << 16);
}

uint kivi_code(float x, float sh, float mnh, uint bits) {
    if (sh == 0.0) return 0u;
    precise float dx = x - mnh;
    float t = roundEven(fdiv(dx, sh));
    if (!(t >= 0.0)) t = 0.0;
    return min(uint(t), (1u << bits) - 1u);
}
#endif
