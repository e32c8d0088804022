// A user's approximate multiplier, as pamsim's docs walk through it (docs/costs.md,
// "Bring your own multiplier"): float8_e5m2 x float8_e5m2 -> bfloat16, the 3x3-bit
// significand product truncated to 2 fraction bits; zero and subnormal operands read
// as zero (DAZ); NaN, inf x 0 -> NaN; inf x finite -> inf.  Plain combinational Verilog.
module trunc_mul (
    input  wire [7:0]  a,
    input  wire [7:0]  b,
    output wire [15:0] y
);
    wire       s      = a[7] ^ b[7];
    wire [4:0] ea     = a[6:2];
    wire [4:0] eb     = b[6:2];
    wire       a_top  = ea == 5'd31;                     // inf or NaN
    wire       b_top  = eb == 5'd31;
    wire       nan    = (a_top & (a[1:0] != 2'd0)) | (b_top & (b[1:0] != 2'd0));
    wire       zero   = (ea == 5'd0) | (eb == 5'd0);
    wire       inf    = a_top | b_top;
    wire [5:0] p      = {1'b1, a[1:0]} * {1'b1, b[1:0]}; // in [1, 4): 4 fraction bits
    wire       hi     = p[5];
    wire [1:0] m      = hi ? p[4:3] : p[3:2];            // truncated to 2 fraction bits
    wire [7:0] e      = {3'd0, ea} + {3'd0, eb} + 8'd97 + {7'd0, hi};  // -30 + 127
    assign y = (nan | (inf & zero)) ? 16'h7fc0 :
               inf  ? {s, 15'h7f80} :
               zero ? {s, 15'd0} : {s, e, m, 5'd0};
endmodule
