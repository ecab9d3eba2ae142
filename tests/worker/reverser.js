// A worker test guest in JavaScript (tests/worker.rs builds it with
// `moat worker build`). Started by a queue, it reverses the message's
// text into the kv namespace `results` and an output; run by hand, it
// reads an input through the `inputs` binding and writes it back
// reversed through `outputs`.
import { names, read } from 'moat:worker/inputs@0.1.0';
import { write } from 'moat:worker/outputs@0.1.0';
import { set } from 'moat:worker/kv@0.1.0';
import { message } from 'moat:worker/queue@0.1.0';

const reverse = (text) => [...text].reverse().join('');

export const run = {
  run() {
    const delivered = message();
    if (delivered !== undefined && delivered !== null) {
      const reversed = reverse(JSON.parse(delivered).text);
      set('results', 'reversed', new TextEncoder().encode(reversed));
      write('message-reversed.txt', new TextEncoder().encode(reversed));
      console.log(`hello from javascript, reversed the message into ${reversed}`);
      return;
    }
    const listed = names();
    const text = new TextDecoder().decode(read(listed[0]));
    write('reversed.txt', new TextEncoder().encode(reverse(text)));
    console.log(`hello from javascript, reversed ${listed[0]}`);
  },
};
